"""How far the decode kernel's own instruction stream lets each scheme go: a static bound from sm_90 SASS.

    eval "$(bash devtools/device_triton.sh)"          # the H200's Triton (header.json), for its instruction counts
    python benchmarks/issue_bound.py --out sweeps/results/h200/issue_bound.csv [--shapes b32,b1] [--schemes q4_0,...]
    python benchmarks/issue_bound.py --env KVLAB_GLUON_KIVI_FOLD=1 --schemes kivi4,kivi2 --shapes b32   # a variant

For every default-dispatch Gluon row of `sweeps/results/h200/decode.csv` (issue 16's schemes, or --schemes), the row's
own config (tile, warps, register cap, prefetch, unroll, L2 prefetch, transposed scores) is compiled offline for sm_90
at the row's shape (`devtools.sm90_offline`), twice: as the tree builds it now, and with the session-27 loop savings
off (KVLAB_GLUON_FOLD_ROWS=0 KVLAB_GLUON_FULL_TILES=0: the kernel the H200 timed in run s26, which measured the b32
and b1 rows). Each warp runs the paged tile loop once per TW tokens, so a call issues at least

    warp tiles x loop instructions = B Hk ceil(L / TW) x loop_instrs        warp instructions,

(loop_instrs on the loop's shortest path, `devtools.sm90_offline.skip_path`: a block the warps branch over when no
head's max moved, the lazy rescale, is not counted; it runs in a warp's first tiles only on these inputs)

and an H200 issues at most SMS x 4 of them a cycle (four schedulers an SM, one instruction each) at its 1.98 GHz
boost clock. That gives, per row (prologue, epilogue and merge left out, so every bound is optimistic):
- issue_floor_ms: the loop at the peak issue rate; no schedule can run the loop faster;
- max_roofline_frac: roofline time (kv_bytes at the measured copy bandwidth) over that floor, capped at 1: the best
  roofline fraction the loop's instruction count allows. Below a target (0.85 at b32) the scheme cannot reach it
  without fewer instructions a tile, however well the loop is scheduled;
- issue_efficiency (b32 / b1 rows, measured in s26): the s26 kernel's floor over its measured graph time, i.e. the
  fraction of issue slots the loop actually used;
- predicted_ms / predicted_frac: the current loop at that measured efficiency (a prediction, not a measurement).
The measured columns are copied from decode.csv. smollm2 / d256 rows were timed before s26 (scores not transposed by
default then): they get the bound, not an efficiency.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

RESULTS = ROOT / "sweeps" / "results" / "h200"
CLOCK_HZ = 1.98e9  # H200 maximum SM clock (nvidia-smi -q -d CLOCK: 1980 MHz)
ISSUE_PER_SM = 4  # warp schedulers an SM, one instruction a cycle each
MEASURED_S26 = ("b32", "b1")  # shapes whose decode.csv rows came from run s26 (9c1f792), the kernel with both off
MEMORY_BOUND = 0.95  # a measured roofline fraction from which the row is taken as bound by DRAM, not by issue
COLUMNS = ["scheme", "shape", "batch", "context", "heads_kv", "head_dim", "page_size", "tokens_per_warp", "num_warps",
           "maxnreg", "prefetch", "regs", "stack", "loop_instrs", "loop_instrs_s26", "warp_tiles", "issue_floor_ms",
           "roofline_ms", "max_roofline_frac", "graph_ms", "roofline_frac_graph", "issue_efficiency", "predicted_ms",
           "predicted_frac", "cudnn_bf16_ms", "predicted_vs_cudnn", "instrs_for_target", "target"]


def shape_name(row: dict) -> str | None:
    """decode.csv row -> run.SHAPES name (None for a shape outside it)."""
    from run import SHAPES
    for name, s in SHAPES.items():
        if all(int(row[k]) == v for k, v in s.items()):
            return name
    return None


def rows_of(decode_csv: Path, schemes: list[str], shapes: list[str]) -> list[dict]:
    """The default-dispatch Gluon rows of decode.csv for these schemes and shapes."""
    out = []
    for r in csv.DictReader(open(decode_csv)):
        if r["dispatch"] != "default" or r["scheme"] not in schemes or not r["config"]:
            continue
        cfg = json.loads(r["config"])
        sh = shape_name(r)
        if cfg.get("kernel") != "gluon" or sh not in shapes:
            continue
        out.append(dict(r, shape=sh, cfg=cfg))
    return out


def count(row: dict) -> dict:
    """Offline sm_90 compile of the row's config at its shape: registers, stack bytes, loop instructions a tile."""
    from devtools.sm90_offline import compile_gluon, resources, sass, skip_path
    from run import SCHEMES
    c = row["cfg"]
    ks = compile_gluon(SCHEMES[row["scheme"]], c.get("num_warps", 4), c.get("tokens_per_warp", 16),
                       Hq=int(row["heads_q"]), Hk=int(row["heads_kv"]), D=int(row["head_dim"]), P=int(row["page_size"]),
                       maxnreg=c.get("maxnreg"), fp=False, prefetch=c.get("prefetch"), unroll=bool(c.get("unroll")),
                       l2=int(c.get("l2_prefetch") or 0), st=c.get("scores_t"))
    k = next(k for name, k in ks if name == "_decode_mma_kernel")
    n = skip_path(sass(k))  # (a loop with a block the warps usually branch over, the lazy rescale: without it)
    res = resources(k)
    reg = int(res.split("REG:")[1].split()[0])
    stack = int(res.split("STACK:")[1].split()[0])
    return dict(regs=reg, stack=stack, loop_instrs=n / (2 if c.get("unroll") else 1))


def counts(rows: list[dict]) -> list[dict]:
    return [count(r) for r in rows]


def s26_counts(args) -> list[dict]:
    """The same compiles with both loop savings off, in a child process (the switches are read at import)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVLAB_GLUON_")}  # the s26 kernel: every switch at
    env.update(KVLAB_GLUON_FOLD_ROWS="0", KVLAB_GLUON_FULL_TILES="0",  # its default of then: both savings off,
               KVLAB_GLUON_KIVI_FOLD="0")  # and KIVI's keys per element (the fold is on by default since session 29)
    cmd = [sys.executable, __file__, "--counts-only", "--decode", str(args.decode), "--schemes", args.schemes,
           "--shapes", args.shapes]
    return json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)


def bound(row: dict, now: dict, s26: dict, copy_tbps: float, sms: int) -> dict:
    """One output row (see the module docstring)."""
    from limits import DECODE_TARGET
    B, L, Hk = int(row["batch"]), int(row["context"]), int(row["heads_kv"])
    TW = row["cfg"].get("tokens_per_warp", 16)
    tiles = B * Hk * math.ceil(L / TW)
    rate = sms * ISSUE_PER_SM * CLOCK_HZ  # warp instructions a second
    floor_ms = tiles * now["loop_instrs"] / rate * 1e3
    floor26_ms = tiles * s26["loop_instrs"] / rate * 1e3
    roof_ms = float(row["kv_bytes"]) / (copy_tbps * 1e12) * 1e3
    g = float(row["graph_ms"]) if row["graph_ms"] else float("nan")
    frac = float(row["roofline_frac_graph"] or "nan")
    eff = floor26_ms / g if row["shape"] in MEASURED_S26 and g == g else float("nan")
    # predictions only where the loop's issue rate decides (b32, below the copy bandwidth); the current loop at the
    # measured efficiency, never faster than the roofline; and the loop a tile that would meet the target there
    issue_bound = row["shape"] == "b32" and eff == eff and frac < MEMORY_BOUND
    pred = max(floor_ms / eff, roof_ms) if issue_bound else float("nan")
    target = DECODE_TARGET.get(row["shape"])
    need = now["loop_instrs"] * (roof_ms / target * eff) / floor_ms if issue_bound and target else float("nan")
    return dict(scheme=row["scheme"], shape=row["shape"], batch=B, context=L, heads_kv=Hk, head_dim=row["head_dim"],
                page_size=row["page_size"], tokens_per_warp=TW, num_warps=row["cfg"].get("num_warps", 4),
                maxnreg=row["cfg"].get("maxnreg"), prefetch=row["cfg"].get("prefetch"), regs=now["regs"],
                stack=now["stack"], loop_instrs=now["loop_instrs"], loop_instrs_s26=s26["loop_instrs"],
                warp_tiles=tiles, issue_floor_ms=round(floor_ms, 4), roofline_ms=round(roof_ms, 4),
                max_roofline_frac=round(min(1.0, roof_ms / floor_ms), 3), graph_ms=round(g, 4),
                roofline_frac_graph=round(frac, 3),
                issue_efficiency=round(eff, 3), predicted_ms=round(pred, 4),
                predicted_frac=round(roof_ms / pred, 3) if pred == pred else float("nan"),
                cudnn_bf16_ms=round(float(row["cudnn_bf16_ms"]), 4),
                predicted_vs_cudnn=round(pred / float(row["cudnn_bf16_ms"]), 3) if pred == pred else float("nan"),
                instrs_for_target=round(need) if need == need else float("nan"), target=target)


def markdown(out: list[dict]) -> str:
    lines = ["| scheme | shape | loop instrs a tile (s26 -> now) | regs / stack | issue floor ms | roofline ms | "
             "max roofline frac | measured frac | issue efficiency | predicted frac (x cuDNN) | loop instrs for the target "
             "| target |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for o in out:
        f = lambda x: "-" if x != x else x  # noqa: E731  (NaN: not measured on this kernel)
        lines.append(f"| {o['scheme']} | {o['shape']} (tw{o['tokens_per_warp']}) | {o['loop_instrs_s26']:g} -> "
                     f"{o['loop_instrs']:g} | {o['regs']} / {o['stack']} | {o['issue_floor_ms']} | {o['roofline_ms']} "
                     f"| {o['max_roofline_frac']} | {f(o['roofline_frac_graph'])} | {f(o['issue_efficiency'])} | "
                     f"{f(o['predicted_frac'])}" + ("" if o["predicted_vs_cudnn"] != o["predicted_vs_cudnn"] else
                                                       f" ({o['predicted_vs_cudnn']}x)") +
                     f" | {f(o['instrs_for_target'])} | {o['target']} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    from limits import DECODE_SCHEMES, DECODE_TARGET
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--decode", type=Path, default=RESULTS / "decode.csv")
    ap.add_argument("--schemes", default=",".join(DECODE_SCHEMES))
    ap.add_argument("--shapes", default=",".join(DECODE_TARGET))
    ap.add_argument("--out", type=Path, default=None, help="CSV (and a .md table beside it); else stdout")
    ap.add_argument("--counts-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--reuse", type=Path, default=None, help="take the instruction counts from this earlier output CSV")
    ap.add_argument("--any-triton", action="store_true", help="count with this Triton even if it is not the H200's")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="a kernel switch for the current loop's counts (e.g. KVLAB_GLUON_KIVI_FOLD=1): the table then "
                         "predicts that variant at each row's config and measured efficiency")
    a = ap.parse_args(argv)
    for kv in a.env:
        name, eq, value = kv.partition("=")
        if not eq or not name.startswith("KVLAB_"):
            raise SystemExit(f"--env {kv!r}: expected KVLAB_NAME=VALUE")
        os.environ[name] = value  # (read when the kernels are imported, below)
    rows = rows_of(a.decode, a.schemes.split(","), a.shapes.split(","))
    if a.counts_only:
        print(json.dumps(counts(rows)))
        return
    header = json.load(open(RESULTS / "header.json"))
    import triton
    if triton.__version__ != header["triton"] and not a.any_triton:
        raise SystemExit(f"Triton {triton.__version__} here, {header['triton']} on the H200 (header.json): run "
                         "`eval \"$(bash devtools/device_triton.sh)\"` first (or --any-triton)")
    if a.reuse:  # the counts of an earlier run's CSV (same rows), to redo the arithmetic without compiling
        prev = {(r["scheme"], r["shape"]): r for r in csv.DictReader(open(a.reuse))}
        got = [prev[(r["scheme"], r["shape"])] for r in rows]
        now = [dict(regs=int(p["regs"]), stack=int(p["stack"]), loop_instrs=float(p["loop_instrs"])) for p in got]
        s26 = [dict(loop_instrs=float(p["loop_instrs_s26"])) for p in got]
    else:
        now, s26 = counts(rows), s26_counts(a)
    out = [bound(r, n, s, header["copy_tbps_read_plus_write"], header["sms"]) for r, n, s in zip(rows, now, s26)]
    if a.out is None:
        print(markdown(out))
        return
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(out)
    envs = "".join(f" --env {kv}" for kv in a.env)
    a.out.with_suffix(".md").write_text(
        f"Static issue bound of the decode loop (`python benchmarks/issue_bound.py{envs} --out "
        f"{os.path.relpath(a.out.resolve(), ROOT)}`, Triton {triton.__version__}, sm_90 offline; measured columns "
        "from decode.csv)\n\n" + markdown(out))
    print(markdown(out))


if __name__ == "__main__":
    main()
