"""`python -m kvlab.sweep`: run a declarative sweep of KV-cache quantization schemes.

    python -m kvlab.sweep [CONFIG.yaml] [--out DIR] [--resume] [--executor local|ray] [--address ADDR]
                          [--device auto|cpu|cuda] [--stages roundtrip,model] [--limit N] [--fresh]
    python -m kvlab.sweep report DIR
    python -m kvlab.sweep search --budget BITS [--candidates SPEC,SPEC,...]   (kvlab.sweep.search_cli)

With no CONFIG, runs the embedded default sweep (kvlab/sweep/default.yaml): every preset plus grids,
round trips on synthetic and real K/V, attention deltas and decode-faithful PPL/KL on SmolLM2;
on a GPU it adds autotuned kernel timings. Cells (scheme x stage x shape) are appended to
DIR/cells.jsonl as they finish and DIR/results.parquet + results.csv are rebuilt after each one;
--resume skips finished cells (a killed sweep loses none). Ends with the Pareto table
(DIR/pareto.csv, DIR/pareto.png). `report DIR` re-renders those from a results directory.
"""
from __future__ import annotations

import argparse
import sys
import time
from importlib import resources
from pathlib import Path


def default_config_path() -> str:
    return str(resources.files("kvlab.sweep").joinpath("default.yaml"))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvlab.sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="?", help="sweep YAML (default: the embedded default sweep)")
    p.add_argument("--out", help="results directory (default: sweeps/results/<name>[-gpu])")
    p.add_argument("--resume", action="store_true", help="skip cells already in the results directory")
    p.add_argument("--fresh", action="store_true", help="delete earlier results in the directory first")
    p.add_argument("--executor", default="local", choices=["local", "ray"])
    p.add_argument("--address", help="Ray cluster address (with --executor ray; default: start a local one)")
    p.add_argument("--workers", type=int, help="local executor: worker processes (default 1 per GPU, 1 on CPU); "
                   "several per GPU overlap compiles and model stages; speed cells are timed one at a time, with the "
                   "pool idle, before the model cells")
    p.add_argument("--device", default=None, choices=["auto", "cpu", "cuda"], help="override the config's device")
    p.add_argument("--stages", help="comma-separated subset of the config's stages")
    p.add_argument("--limit", type=int, help="run only the first N cells (smoke tests)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _device(want: str) -> str:
    import torch
    if want == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda was asked for but no CUDA GPU is visible; use --device cpu")
    return want


def run(argv=None) -> int:
    a = build_parser().parse_args(argv)
    from tqdm import tqdm

    from .cells import expand_cells
    from .config import load_config
    from .executors import execute
    from .pareto import report
    from .results import SweepResults, run_metadata
    try:
        cfg = load_config(a.config or default_config_path())
        device = _device(a.device or cfg.device)
        cfg = cfg.for_device(device)
        if a.stages:
            want = [s.strip() for s in a.stages.split(",")]
            bad = [s for s in want if s not in cfg.stages]
            if bad:
                raise ValueError(f"--stages {','.join(bad)}: not in this sweep; it has {', '.join(cfg.stages)}")
            cfg.stages = {k: v for k, v in cfg.stages.items() if k in want}
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(a.out or Path("sweeps") / "results" / (cfg.name + ("-gpu" if device == "cuda" else "")))
    results = SweepResults(out)
    if a.fresh:
        results.reset()
    cells = expand_cells(cfg)[: a.limit] if a.limit else expand_cells(cfg)
    done = results.done_ids()
    if done and not a.resume:
        print(f"error: {out} already holds {len(done)} finished cells; pass --resume to continue them "
              "or --fresh to start over", file=sys.stderr)
        return 2
    todo = [c.to_dict() for c in cells if c.id not in done]
    meta = run_metadata(device, cfg.seed)
    print(f"sweep {cfg.name}: {len(cfg.schemes)} schemes x stages {', '.join(cfg.stages)} = {len(cells)} cells "
          f"({len(cells) - len(todo)} already done) on {device} ({meta['device_name']}); executor {a.executor}; "
          f"results in {out}", file=sys.stderr)
    t0, errors = time.time(), []
    with tqdm(total=len(todo), unit="cell", disable=a.quiet, file=sys.stderr, dynamic_ncols=True) as bar:
        def on_row(row: dict) -> None:
            results.append({**row, **meta})
            results.write_tables()
            if row["status"].startswith("error"):
                errors.append(f"{row['name']} / {row['stage']} / {row['shape']}: {row['status']}")
            bar.set_postfix_str(f"{row['stage']} {row['name']}"[:40])
            bar.update(1)
        try:
            execute(todo, device, on_row, a.executor, a.address, a.workers)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    df = results.write_tables()
    skipped = int(df["status"].str.startswith("skipped").sum()) if len(df) else 0
    print(f"\n{len(df)} cells in {out}/results.parquet ({skipped} skipped, {len(errors)} errors); "
          f"this run {time.time() - t0:.0f} s", file=sys.stderr)
    for e in errors:
        print(f"  {e}", file=sys.stderr)
    print(f"\nPareto frontier ({out}/pareto.csv, pareto.png):")
    report(out)
    return 1 if errors else 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "search":
        from .search_cli import main as search_main
        return search_main(argv[1:])
    if argv and argv[0] == "report":
        if len(argv) != 2:
            print("usage: python -m kvlab.sweep report DIR", file=sys.stderr)
            return 2
        from .pareto import report
        try:
            report(argv[1])
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
