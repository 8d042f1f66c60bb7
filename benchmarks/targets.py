"""Issues 16 and 17's targets against result tables: every target cell with its value, pass or miss, and what
limits each miss where a `benchmarks/limits.py` summary profiled it. This is the closing note's table.

    python benchmarks/targets.py                                  # the committed H200 tables (sweeps/results/h200)
    python benchmarks/targets.py --results sweeps/results/h100/runs/s32-c7aaa2d    # a run folder (decode/, store/)
    python benchmarks/targets.py --limits sweeps/results/h100/runs/s31-store-84d4744/limits_store.csv --out t.md

A folder is searched for decode.csv, store.csv, extend.csv and flashinfer_fp8.csv (directly or one folder down);
--decode / --store / --extend / --peers name files directly. The targets (issue texts):
  decode, default dispatch, graph replay: roofline fraction >= 0.85 at B 32 x 32K, >= 0.6 at B 1 x 32K, >= 0.7 at
    SmolLM2's (D 64) and the D 256 shape, for issue 16's 14 schemes (`limits.DECODE_TARGET`, `DECODE_SCHEMES`);
    at B 32 x 32K q4_0 <= 0.36x cuDNN bf16, kivi4 <= 0.40x, the 2-bit schemes (int2, kivi2) <= 0.25x;
    the untuned call within 10% of the tuned one: a `heuristic` row (no tuned entry) over its `default` row;
    B 1 x 32K fp8 faster than FlashInfer's XQA (the peers file's same-process kvlab and xqa rows);
  store, 32K-token write: fraction of copy bandwidth >= 0.6, every scheme (the fused `triton` rows);
  extend, host lengths (the model's prefill): ratio to cuDNN bf16 on dense K / V <= 1.2, bf16 <= 1.1.
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import limits  # noqa: E402  (the targets and the shape names live there)

RATIO_TARGET = {"q4_0": 0.36, "kivi4": 0.40, "int2": 0.25, "kivi2": 0.25}  # x cuDNN bf16 at B 32 x 32K (issue 16)
UNTUNED_SLACK = 1.10   # an untuned (heuristic) call within 10% of the tuned one
EXTEND_BF16_TARGET = 1.1


@dataclass
class Cell:
    """One target cell: `value` against `target` (`le`: the value must not exceed it), and the case name
    `limits.py` profiles it under."""
    issue: int
    check: str
    scheme: str
    value: float | None
    target: float
    le: bool = False
    case: str = ""

    @property
    def ok(self) -> bool | None:
        if self.value is None or math.isnan(self.value):
            return None
        return self.value <= self.target if self.le else self.value >= self.target


def _find(folder: Path | None, name: str) -> Path | None:
    if folder is None:
        return None
    for p in (folder / name, *sorted(folder.glob(f"*/{name}"))):
        if p.is_file():
            return p
    return None


def _rel(path: Path) -> str:
    """The path from the repository root where it lies inside it (so a committed report names no machine)."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _rows(path: Path | None) -> list[dict]:
    return list(csv.DictReader(open(path))) if path else []


def _f(text) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def decode_cells(rows: list[dict]) -> list[Cell]:
    """Issue 16's cells of a decode.csv: the roofline fraction per target shape, the x-cuDNN ratios at B 32 x 32K and
    each heuristic row over its default row (the last row of a key wins, as in the tables' merges)."""
    by: dict[tuple, dict] = {}
    for r in rows:
        shape = limits._shape_key(r)
        if shape and r["scheme"] in limits.DECODE_SCHEMES and not r.get("error"):
            by[(r["dispatch"], shape, r["scheme"])] = r
    out = []
    for shape, target in limits.DECODE_TARGET.items():
        for s in limits.DECODE_SCHEMES:
            r = by.get(("default", shape, s))
            if r is not None:
                out.append(Cell(16, f"decode {shape} roofline", s, _f(r["roofline_frac_graph"]), target,
                                case=f"decode:{shape}:{s}"))
    for s, target in RATIO_TARGET.items():
        r = by.get(("default", "b32", s))
        if r is not None:
            out.append(Cell(16, "decode b32 x cuDNN", s, _f(r["ratio_graph_vs_cudnn"]), target, le=True,
                            case=f"decode:b32:{s}"))
    for (dispatch, shape, s), r in by.items():
        d = by.get(("default", shape, s))
        if dispatch == "heuristic" and d is not None and _f(d["graph_ms"]) and _f(r["graph_ms"]):
            out.append(Cell(16, f"decode {shape} untuned / tuned", s, _f(r["graph_ms"]) / _f(d["graph_ms"]),
                            UNTUNED_SLACK, le=True))
    return out


def peer_cells(rows: list[dict]) -> list[Cell]:
    """Issue 16's B 1 x 32K fp8 against FlashInfer's XQA: kvlab's median over XQA's, same process (flashinfer_fp8.csv)."""
    med = {(r["impl"], r.get("batch"), r.get("context")): _f(r.get("median_ms")) for r in rows if r.get("test") != "correctness"}
    k, x = med.get(("kvlab", "1", "32768")), med.get(("xqa", "1", "32768"))
    return [Cell(16, "decode b1 fp8 / XQA", "fp8_e4m3", k / x, 1.0, le=True)] if k and x else []


def store_cells(rows: list[dict]) -> list[Cell]:
    """Issue 17's store cells: each scheme's fused-kernel fraction of copy bandwidth at a 32K-token write."""
    import run
    last = {r["scheme"]: r for r in rows if r.get("backend") == "triton" and r["scheme"] in run.SCHEMES}
    return [Cell(17, "store 32k of copy", s, _f(r["fraction_of_copy"]), limits.STORE_TARGET, case=f"store:32k:{s}")
            for s, r in last.items()]


def extend_cells(rows: list[dict]) -> list[Cell]:
    """Issue 17's extend cells: the host-length rows' (auto_host) ratio to cuDNN per shape, bf16 against 1.1."""
    import run
    names = {tuple(str(v) for v in s.values()): n for n, s in run.EXTEND_SHAPES.items()}
    last = {}
    for r in rows:
        key = tuple(r[k] for k in ("batch", "prefix", "chunk", "heads_q", "heads_kv", "head_dim"))
        if r.get("backend") == "auto_host" and key in names and r["scheme"] in run.SCHEMES:
            last[(names[key], r["scheme"])] = r
    return [Cell(17, f"extend {shape} x cuDNN", s, _f(r["ratio_vs_cudnn"]),
                 EXTEND_BF16_TARGET if s == "bf16" else limits.EXTEND_TARGET, le=True, case=f"extend:{shape}:{s}")
            for (shape, s), r in last.items()]


def read_limits(paths: list[Path]) -> dict[str, dict]:
    """case -> its `limits.py` summary row (a later file wins)."""
    out = {}
    for p in paths:
        for r in csv.DictReader(open(p)):
            out[r["case"]] = r
    return out


def report(cells: list[Cell], lim: dict[str, dict], sources: dict[str, Path | None]) -> str:
    """Markdown: the files read, one line a check (met / cells, the misses with their values), then a table of
    every miss with its limiter where profiled."""
    lines = ["Files: " + ", ".join(f"{k} `{_rel(v)}`" for k, v in sources.items() if v), ""]
    lines += ["| issue | check | met | misses (value vs target) |", "|---|---|---|---|"]
    checks: dict[tuple, list[Cell]] = {}
    for c in cells:
        checks.setdefault((c.issue, c.check), []).append(c)
    for (issue, check), cs in checks.items():
        judged = [c for c in cs if c.ok is not None]
        miss = [c for c in judged if not c.ok]
        t = cs[0].target if len({c.target for c in cs}) == 1 else "/".join(f"{c.target:g}" for c in cs[:2])
        text = ", ".join(f"{c.scheme} {c.value:.3g}" for c in miss) or "none"
        lines.append(f"| {issue} | {check} ({'<=' if cs[0].le else '>='} {t}) | {len(judged) - len(miss)} / "
                     f"{len(judged)} | {text} |")
    prof = [c for c in cells if c.ok is False and c.case in lim]
    if prof:
        lines += ["", "| case | value | target | limiter | issue % | DRAM % | top stalls |", "|---|---|---|---|---|---|---|"]
        for c in prof:
            r = lim[c.case]
            lines.append(f"| {c.case} | {c.value:.3g} | {c.target:g} | {r.get('limiter', '')} | {r.get('issue_pct', '')} "
                         f"| {r.get('dram_pct', '')} | {r.get('top_stalls', '')} |")
    unprof = sorted({c.case for c in cells if c.ok is False and c.case and c.case not in lim})
    if lim and unprof:
        lines += ["", f"Misses no limits summary covers: {', '.join(unprof)}"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(limits.RESULTS), help="a folder with the tables (or one folder down)")
    for name in ("decode", "store", "extend", "peers"):
        ap.add_argument(f"--{name}", default=None, help=f"the {name} table itself (overrides --results)")
    ap.add_argument("--limits", default="", help="comma-separated limits_*.csv summaries (benchmarks/limits.py)")
    ap.add_argument("--out", default=None, help="write the markdown here (default: stdout)")
    a = ap.parse_args(argv)
    folder = Path(a.results)
    if not folder.is_dir():
        raise SystemExit(f"--results {folder}: not a folder")
    files = {}
    for name, fname in (("decode", "decode.csv"), ("store", "store.csv"), ("extend", "extend.csv"),
                        ("peers", "flashinfer_fp8.csv")):
        given = getattr(a, name)
        if given and not Path(given).is_file():
            raise SystemExit(f"--{name} {given}: no such file")
        files[name] = Path(given) if given else _find(folder, fname)
    if not any(files.values()):
        raise SystemExit(f"no decode.csv, store.csv, extend.csv or flashinfer_fp8.csv in {folder} or one folder down")
    cells = (decode_cells(_rows(files["decode"])) + peer_cells(_rows(files["peers"]))
             + store_cells(_rows(files["store"])) + extend_cells(_rows(files["extend"])))
    lim_paths = [Path(p) for p in a.limits.split(",") if p]
    for p in lim_paths:
        if not p.is_file():
            raise SystemExit(f"--limits {p}: no such file")
    text = report(cells, read_limits(lim_paths), files)
    if a.out:
        Path(a.out).write_text(text)
    else:
        print(text, end="")
    return text


if __name__ == "__main__":
    main()
