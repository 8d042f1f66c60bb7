"""What limits each kernel that misses its target: Nsight Compute over the public API's default dispatch.

    bash benchmarks/h200_run.sh limits                       # on the H200 (device call): decode, store, extend
    python benchmarks/limits.py --misses decode:b32,store    # the cases: rows of the committed tables that miss
    python benchmarks/limits.py --smoke --cases CASES        # here: each case built and run on tiny CPU shapes
    python benchmarks/limits.py --summarize ncu.csv --cases CASES --out limits.csv

A case is OP:SHAPE:SCHEME: decode at `run.SHAPES` (b32, b1, smollm2, d256, ...), store at 32k (a 32K-token write,
Hk 8, D 128, as the store table), extend at `run.EXTEND_SHAPES` with host lengths (p8k_b1, smollm2_p8k, ...; batch 1
replays its CUDA graph, as the extend table's auto_host rows). Schemes as `run.SCHEMES`.

Driver (`--run`, under `ncu --profile-from-start off`): each case is built and called three times (compiles, plans,
first-call tiles, graph capture), then inside cudaProfilerStart / Stop a marker kernel with (case index + 1) programs
and one call. ncu profiles every kernel in that window, and the summary gives the kernels after marker k to case k (a
decode with splits is its kernel and the merge; an extend its dequant, attention and merge launches).

Summary (`--summarize`, one row a case; the raw counters stay in ncu's CSV): total and main-kernel time, DRAM and L2
throughput (% of peak), issue activity (% of cycles a scheduler issues), eligible warps a scheduler, occupancy,
registers, the three busiest pipes (% of peak over active cycles), the three largest stall reasons (cycles an issued
instruction; selected / not_selected left out), every kernel's time, and `limiter`, the main kernel's by this rule:
  DRAM bandwidth    where DRAM throughput >= 80% of peak;
  PIPE pipe         else where the busiest pipe is >= 70% of its peak;
  instruction issue else where the schedulers issue on >= 70% of cycles;
  latency (STALL)   else: the largest stall reason names what the warps wait for.
"""
from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

RESULTS = ROOT / "sweeps" / "results" / "h200"
OPS = ("decode", "store", "extend")
# issue 16 / 17 targets a committed row misses (`misses`): decode's roofline fraction (graph replay) per shape, the
# store's fraction of copy bandwidth, extend's ratio to cuDNN on dense bf16 (the host-length rows a model's prefill takes)
DECODE_TARGET = {"b32": 0.85, "b1": 0.6, "smollm2": 0.7, "d256": 0.7}
DECODE_SCHEMES = ("bf16", "fp8_e4m3", "q8_0", "q4_0", "q4_1", "int4_had", "kivi4", "kivi2", "int3", "int2", "mxfp4",
                  "nvfp4", "nf4", "iq4nl")  # issue 16's (decode.csv also holds the Lloyd-Max rows)
STORE_TARGET = 0.6
EXTEND_TARGET = 1.2
DRAM_BOUND, PIPE_BOUND, ISSUE_BOUND = 80.0, 70.0, 70.0  # % of peak (`limiter`)
MARKER = "_limits_marker"
SUMMARY_COLUMNS = ["case", "table", "target", "kernels", "total_us", "main_kernel", "main_us", "dram_pct", "l2_pct",
                   "issue_pct", "eligible_warps", "occupancy_pct", "regs", "top_pipes", "top_stalls", "limiter",
                   "kernel_times"]
# ncu's raw counters beside its sections: stall reasons an issued instruction, pipe utilization, issue activity
METRICS = ("regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio,"
           "regex:sm__inst_executed_pipe_[a-z0-9_]+\\.avg\\.pct_of_peak_sustained_active,"
           "regex:sm__pipe_[a-z0-9_]+_cycles_active\\.avg\\.pct_of_peak_sustained_active,"
           "smsp__issue_active.avg.pct_of_peak_sustained_active,dram__bytes_read.sum,dram__bytes_write.sum")
SECTIONS = ("SpeedOfLight", "MemoryWorkloadAnalysis", "Occupancy", "WarpStateStats", "SchedulerStats", "LaunchStats",
            "ComputeWorkloadAnalysis")


def _shape_key(row: dict) -> str | None:
    """The `run.SHAPES` name of a decode.csv row (None: a shape without an issue 16 target)."""
    import run
    for name in DECODE_TARGET:
        s = run.SHAPES[name]
        if all(str(s[k]) == row[k] for k in ("batch", "context", "heads_q", "heads_kv", "head_dim")):
            return name
    return None


def misses(ops: list[str], results: Path = RESULTS) -> list[str]:
    """The cases of the committed tables' rows that miss their issue targets, for each `OP` or `OP:SHAPE` in ops:
    decode rows of default dispatch under DECODE_TARGET's roofline fraction; store rows (the fused kernels, not the
    pre-rotated comparison) under STORE_TARGET of copy; extend auto_host rows over EXTEND_TARGET x cuDNN."""
    import run
    want: dict[str, set | None] = {}
    for o in ops:
        op, _, shape = o.partition(":")
        if op not in OPS:
            raise ValueError(f"unknown op {op!r} in {o!r}; allowed: {', '.join(OPS)} (optionally OP:SHAPE)")
        if shape:
            want.setdefault(op, set())
            if want[op] is not None:
                want[op].add(shape)
        else:
            want[op] = None
    out = []

    def keep(op, shape):
        return op in want and (want[op] is None or shape in want[op])

    if "decode" in want:
        for r in csv.DictReader(open(results / "decode.csv")):
            shape = _shape_key(r)
            if (r["dispatch"] == "default" and shape and keep("decode", shape) and r["scheme"] in DECODE_SCHEMES
                    and r["roofline_frac_graph"] and float(r["roofline_frac_graph"]) < DECODE_TARGET[shape]):
                out.append(f"decode:{shape}:{r['scheme']}")
    if "store" in want and keep("store", "32k"):
        for r in csv.DictReader(open(results / "store.csv")):
            if (r["backend"] == "triton" and r["scheme"] in run.SCHEMES and r["fraction_of_copy"]
                    and float(r["fraction_of_copy"]) < STORE_TARGET):
                out.append(f"store:32k:{r['scheme']}")
    if "extend" in want:
        names = {tuple(str(v) for v in s.values()): n for n, s in run.EXTEND_SHAPES.items()}
        for r in csv.DictReader(open(results / "extend.csv")):
            key = tuple(r[k] for k in ("batch", "prefix", "chunk", "heads_q", "heads_kv", "head_dim"))
            shape = names.get(key)
            if (r["backend"] == "auto_host" and shape and keep("extend", shape) and r["scheme"] in run.SCHEMES
                    and r["ratio_vs_cudnn"] and float(r["ratio_vs_cudnn"]) > EXTEND_TARGET):
                out.append(f"extend:{shape}:{r['scheme']}")
    return list(dict.fromkeys(out))


def table_value(case: str, results: Path = RESULTS) -> tuple[float | None, float]:
    """(the committed table's number for the case, its issue target): decode's roofline fraction (graph replay,
    default dispatch), the store's fraction of copy bandwidth, extend's ratio to cuDNN (auto_host); None where the
    table has no such row."""
    import run
    op, shape, name = parse_case(case)
    if op == "decode":
        target, col = DECODE_TARGET.get(shape, float("nan")), "roofline_frac_graph"
        want = {k: str(run.SHAPES[shape][k]) for k in ("batch", "context", "heads_q", "heads_kv", "head_dim")}
        rows = [r for r in csv.DictReader(open(results / "decode.csv")) if r["dispatch"] == "default"
                and r["scheme"] == name and all(r[k] == v for k, v in want.items())]
    elif op == "store":
        target, col = STORE_TARGET, "fraction_of_copy"
        rows = [r for r in csv.DictReader(open(results / "store.csv")) if r["backend"] == "triton"
                and r["scheme"] == name]
    else:
        target, col = EXTEND_TARGET, "ratio_vs_cudnn"
        want = {k: str(v) for k, v in run.EXTEND_SHAPES[shape].items()}
        rows = [r for r in csv.DictReader(open(results / "extend.csv")) if r["backend"] == "auto_host"
                and r["scheme"] == name and all(r[k] == v for k, v in want.items())]
    vals = [float(r[col]) for r in rows if r.get(col)]
    return (vals[-1] if vals else None), target


def parse_case(case: str) -> tuple[str, str, str]:
    """OP:SHAPE:SCHEME -> its three parts, checked against the shapes and schemes the benchmark runner knows."""
    import run
    parts = case.split(":")
    if len(parts) != 3:
        raise ValueError(f"case {case!r}: expected OP:SHAPE:SCHEME, e.g. decode:b32:q4_0")
    op, shape, name = parts
    shapes = {"decode": run.SHAPES, "store": {"32k": None}, "extend": run.EXTEND_SHAPES}
    if op not in shapes:
        raise ValueError(f"case {case!r}: op {op!r}; allowed: {', '.join(OPS)}")
    if shape not in shapes[op]:
        raise ValueError(f"case {case!r}: shape {shape!r}; allowed for {op}: {', '.join(shapes[op])}")
    if name not in run.SCHEMES:
        raise ValueError(f"case {case!r}: scheme {name!r}; allowed: {', '.join(run.SCHEMES)}")
    return op, shape, name


def build(case: str, device: str = "cuda", smoke: bool = False):
    """A no-argument callable that runs the case once through the public API with default dispatch (smoke: tiny
    shapes, for a CPU check of the driver under the interpreter)."""
    import kvlab
    import run
    op, shape, name = parse_case(case)
    sch = kvlab.scheme(run.SCHEMES[name])
    if op == "decode":
        s = dict(run.SHAPES[shape])
        if smoke:
            s.update(batch=min(s["batch"], 2), context=70, heads_q=s["heads_q"] // s["heads_kv"] * 2, heads_kv=2)
        return run.decode_plan(sch, s, device=device)[0]
    if op == "store":
        from kvlab.kernels.autotune import store_write
        return store_write(sch.k, 64 if smoke else 32768, 2 if smoke else 8, 64 if smoke else 128, run.page_size(sch),
                           device)
    from profile_extend import extend_case
    s = dict(run.EXTEND_SHAPES[shape])
    if smoke:
        s.update(prefix=64, chunk=16, heads_q=s["heads_q"] // s["heads_kv"] * 2, heads_kv=2)
    return extend_case(shape, name, "auto_host", device=device, shape=s)


def _marker_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def _limits_marker(X):
        tl.store(X + tl.program_id(0), tl.program_id(0))
    return _limits_marker


def drive(cases: list[str], device: str = "cuda", smoke: bool = False, warm: int = 3,
          budget_s: float | None = None) -> list[str]:
    """Build and warm each case, then profile one call after its marker (cudaProfilerStart / Stop around both).
    Returns the cases that ran; a case that fails is reported on stderr and gets no marker. budget_s: no case starts
    after that many seconds (so a profiler around this process ends in time to write its results)."""
    import time

    import torch
    t0 = time.monotonic()
    marker = _marker_kernel()
    mbuf = torch.zeros(len(cases) + 1, dtype=torch.int32, device=device)
    cuda = torch.device(device).type == "cuda"
    ran = []
    for i, case in enumerate(cases):
        if budget_s is not None and time.monotonic() - t0 > budget_s:
            print(f"budget of {budget_s:.0f} s spent: {len(cases) - i} cases not profiled, from {case}", flush=True)
            break
        on = False
        try:
            fn = build(case, device, smoke)
            for _ in range(warm):
                fn()
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.profiler.start()
                on = True
            marker[(i + 1,)](mbuf)
            fn()
            ran.append(case)
            print(f"profiled {i + 1} {case}", flush=True)
        except Exception as e:  # noqa: BLE001 (one case's failure must not cost the others their profiles)
            print(f"failed {i + 1} {case}: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr, flush=True)
        finally:
            if on:  # (the next case's warm-up calls stay outside the profiled window)
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
    return ran


# ---- the summary of ncu's CSV ----------------------------------------------------------------------------------
_TIME = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}


def read_kernels(path: str | Path) -> list[dict]:
    """The profiled kernels of ncu's `--csv --page details` output, in launch order: dicts of id, name, grid (the
    "(x, y, z)" text) and metrics {metric name: (unit, value)} (the first value of a name)."""
    kernels: dict[int, dict] = {}
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]  # ncu and the profiled process also print plain lines
    for r in csv.DictReader(lines):
        try:
            kid = int(r["ID"])
        except (KeyError, TypeError, ValueError):
            continue
        k = kernels.setdefault(kid, {"id": kid, "name": r.get("Kernel Name", ""), "grid": r.get("Grid Size", ""),
                                     "metrics": {}})
        name, value = r.get("Metric Name"), (r.get("Metric Value") or "").replace(",", "")
        if not name or not value:
            continue
        try:
            k["metrics"].setdefault(name, (r.get("Metric Unit") or "", float(value)))
        except ValueError:
            continue
    return [kernels[i] for i in sorted(kernels)]


def group(kernels: list[dict], cases: list[str]) -> dict[str, list[dict]]:
    """The kernels after each marker, under its case (marker with k programs -> cases[k - 1])."""
    out: dict[str, list[dict]] = {}
    cur = None
    for k in kernels:
        if k["name"].startswith(MARKER):
            m = re.match(r"\(\s*(\d+)", k["grid"])
            idx = int(m.group(1)) - 1 if m else -1
            if not 0 <= idx < len(cases):
                raise ValueError(f"marker kernel {k['id']} with grid {k['grid']!r} names no case of {len(cases)}")
            cur = cases[idx]
            out.setdefault(cur, [])
        elif cur is not None:
            out[cur].append(k)
    return out


def _us(k: dict) -> float:
    unit, v = k["metrics"].get("Duration", ("ns", float("nan")))
    return v * _TIME.get(unit, float("nan"))


def _metric(m: dict, *names: str) -> float | None:
    """The value of the first of `names` the kernel's metrics hold (None: none)."""
    for n in names:
        if n in m:
            return m[n][1]
    return None


def pipes(m: dict) -> dict[str, float]:
    """Pipe -> utilization (% of peak over active cycles): the larger of its instruction and cycle counters."""
    out: dict[str, float] = {}
    for name, (_, v) in m.items():
        p = re.fullmatch(r"sm__inst_executed_pipe_([a-z0-9_]+)\.avg\.pct_of_peak_sustained_active", name) or \
            re.fullmatch(r"sm__pipe_([a-z0-9_]+)_cycles_active\.avg\.pct_of_peak_sustained_active", name)
        if p:
            out[p.group(1)] = max(out.get(p.group(1), 0.0), v)
    return out


def stalls(m: dict) -> dict[str, float]:
    """Stall reason -> cycles an issued instruction (selected / not_selected left out: they are issue, not waiting)."""
    out = {}
    for name, (_, v) in m.items():
        s = re.fullmatch(r"smsp__average_warps_issue_stalled_([a-z_]+)_per_issue_active\.ratio", name)
        if s and s.group(1) not in ("selected", "not_selected"):
            out[s.group(1)] = v
    return out


def issue_pct(m: dict) -> float | None:
    """% of cycles a scheduler issues an instruction."""
    v = _metric(m, "smsp__issue_active.avg.pct_of_peak_sustained_active")
    if v is None and "Issued Warp Per Scheduler" in m:
        v = 100.0 * m["Issued Warp Per Scheduler"][1]
    return v


def limiter(m: dict) -> str:
    """The module docstring's rule on one kernel's metrics."""
    dram = _metric(m, "DRAM Throughput", "dram__throughput.avg.pct_of_peak_sustained_elapsed")
    if dram is not None and dram >= DRAM_BOUND:
        return "DRAM bandwidth"
    p = pipes(m)
    if p:
        top = max(p, key=p.get)
        if p[top] >= PIPE_BOUND:
            return f"{top} pipe"
    iss = issue_pct(m)
    if iss is not None and iss >= ISSUE_BOUND:
        return "instruction issue"
    s = stalls(m)
    return f"latency ({max(s, key=s.get)})" if s else "unknown (no stall counters)"


def _top(d: dict[str, float], n: int = 3, fmt: str = "{:.0f}") -> str:
    return " ".join(f"{k}:{fmt.format(v)}" for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:n])


def summarize(case: str, kernels: list[dict], results: Path = RESULTS) -> dict:
    """One summary row (SUMMARY_COLUMNS) of a case's kernels, beside the committed table's number and the issue's
    target for it; the limiter is the longest kernel's."""
    val, target = table_value(case, results)
    row = {"case": case, "table": "" if val is None else round(val, 3), "target": target, "kernels": len(kernels)}
    if not kernels:
        return {**row, "limiter": "no kernel profiled"}
    ks = sorted(kernels, key=_us, reverse=True)
    main = ks[0]
    m = main["metrics"]

    def r(v, nd=1):
        return "" if v is None else round(v, nd)
    row.update(total_us=r(sum(_us(k) for k in ks)), main_kernel=main["name"], main_us=r(_us(main)),
               dram_pct=r(_metric(m, "DRAM Throughput")), l2_pct=r(_metric(m, "L2 Cache Throughput")),
               issue_pct=r(issue_pct(m)), eligible_warps=r(_metric(m, "Eligible Warps Per Scheduler"), 2),
               occupancy_pct=r(_metric(m, "Achieved Occupancy")), regs=r(_metric(m, "Registers Per Thread"), 0),
               top_pipes=_top(pipes(m)), top_stalls=_top(stalls(m), fmt="{:.2f}"), limiter=limiter(m),
               kernel_times=" ".join(f"{k['name'][:40]}:{_us(k):.1f}" for k in ks))
    return row


def write_summary(ncu_csv: str, cases: list[str], out: str | None) -> list[dict]:
    """The summary rows of an ncu CSV as CSV (to `out`, or stdout), and as a markdown table beside it (out.md)."""
    rows = [summarize(c, ks) for c, ks in group(read_kernels(ncu_csv), cases).items()]
    f = open(out, "w", newline="") if out else sys.stdout
    w = csv.DictWriter(f, SUMMARY_COLUMNS, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    if out:
        f.close()
        Path(out).with_suffix(".md").write_text(markdown(rows))
    return rows


def markdown(rows: list[dict]) -> str:
    """The closing note's table: case, table / target, main kernel time, DRAM, issue, busiest pipes, stalls, limiter."""
    cols = ["case", "table", "target", "main_us", "dram_pct", "issue_pct", "top_pipes", "top_stalls", "limiter"]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(out) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="", help="comma-separated OP:SHAPE:SCHEME")
    ap.add_argument("--misses", default="", help="comma-separated OP or OP:SHAPE: the committed rows that miss")
    ap.add_argument("--run", action="store_true", help="drive the cases (under ncu --profile-from-start off)")
    ap.add_argument("--smoke", action="store_true", help="drive the cases on tiny CPU shapes (TRITON_INTERPRET=1)")
    ap.add_argument("--summarize", default=None, help="ncu --csv --page details output to summarize")
    ap.add_argument("--out", default=None, help="summary CSV (default: stdout)")
    ap.add_argument("--budget", type=float, default=None, help="--run: start no case after this many seconds")
    ap.add_argument("--print-ncu-args", action="store_true", help="the ncu options this summary expects")
    a = ap.parse_args(argv)
    if a.print_ncu_args:
        print(" ".join(f"--section {s}" for s in SECTIONS) + f" --metrics {METRICS}")
        return
    cases = [c for c in a.cases.split(",") if c] + (misses(a.misses.split(",")) if a.misses else [])
    cases = list(dict.fromkeys(cases))
    for c in cases:
        parse_case(c)
    if a.summarize:
        write_summary(a.summarize, cases, a.out)
    elif a.run or a.smoke:
        drive(cases, "cpu" if a.smoke else "cuda", smoke=a.smoke, warm=1 if a.smoke else 3, budget_s=a.budget)
    else:
        print(",".join(cases))


if __name__ == "__main__":
    main()
