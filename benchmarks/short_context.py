"""Where a quantized decode step's time goes at short contexts (issue 16): Gemma 3's sliding layers hold 512 tokens,
and there a quantized pair cost 0.08-0.10 ms against bf16's 0.011 (`sweeps/results/h200/runs/s13c-*/winners/`).

    python benchmarks/short_context.py --out DIR [--contexts 128,512,2048,8192] [--budget 300]

For each shape (Gemma 3 270M's: Hq 4, Hk 1, D 256; SmolLM2's: Hq 9, Hk 3, D 64; B 32), each scheme and each
(window, sink) of --fp, at each context: the public `decode` (default dispatch, plan, CUDA-graph replay median, as
benchmarks/run.py's decode_cell) with the default split count (and at --profile-context with --splits too); then one torch.profiler trace of
a few eager launches of the plan per scheme at --profile-context, its CUDA kernels and their mean time a step.
Writes DIR/short_context.csv (shape, scheme, window, sink, context, splits, config, graph_ms, error) and
DIR/kernels.csv (shape, scheme, window, sink, kernel, us_per_step, calls_per_step).
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

DEVICE = "cuda"
SHAPES = {"gemma3": dict(heads_q=4, heads_kv=1, head_dim=256), "smollm2": dict(heads_q=9, heads_kv=3, head_dim=64)}
SCHEMES = ["bf16", "q4_0", "int4:g32:chan:asym|lm3:rot=had", "lm2:s=e4m3:rot=had", "lm2:s=e4m3:rot=had:smooth|lm2:s=e4m3:rot=had"]


def _scheme(text: str, window: int, sink: int):
    import kvlab
    ks, _, vs = text.partition("|")
    extra = f",window={window}" if window else ""
    extra += f",sink={sink}" if sink else ""
    return kvlab.scheme(f"k={ks},v={vs or ks}{extra}")


def _plan(sch, B: int, L: int, Hq: int, Hk: int, D: int, splits: int | None):
    """(plan callable, resolved config dict) through the public decode (run.py's `decode_plan`)."""
    from run import decode_plan
    fn, cfg = decode_plan(sch, dict(batch=B, context=L, heads_q=Hq, heads_kv=Hk, head_dim=D), splits, DEVICE)
    return fn, cfg.to_dict()


def kernels_of(fn, steps: int = 5) -> list[tuple[str, float, float]]:
    """[(kernel name, mean us a step, calls a step)] of `steps` eager launches of `fn` (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        dev = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if dev > 0 and e.count:
            rows.append((e.key[:120], dev / steps, e.count / steps))
    return sorted(rows, key=lambda r: -r[1])


def main(argv=None) -> int:
    import triton.testing
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--contexts", default="128,512,2048,8192")
    p.add_argument("--splits", default="1,4", help="split counts timed beside the default one")
    p.add_argument("--fp", default="0:0,32:4", help="window:sink pairs")
    p.add_argument("--shapes", default="gemma3,smollm2")
    p.add_argument("--schemes", default=";".join(SCHEMES), help="';'-separated, KSPEC|VSPEC allowed")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--profile-context", type=int, default=512)
    p.add_argument("--budget", type=float, default=300.0)
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    cols = ["shape", "scheme", "window", "sink", "context", "splits", "config", "graph_ms", "error"]
    kcols = ["shape", "scheme", "window", "sink", "kernel", "us_per_step", "calls_per_step"]
    with open(out / "short_context.csv", "w", newline="") as f, open(out / "kernels.csv", "w", newline="") as g:
        w, wk = csv.DictWriter(f, fieldnames=cols), csv.DictWriter(g, fieldnames=kcols)
        w.writeheader()
        wk.writeheader()
        for shape in a.shapes.split(","):
            s = SHAPES[shape]
            for text in a.schemes.split(";"):
                for fp in a.fp.split(","):
                    win, sink = (int(x) for x in fp.split(":"))
                    if text == "bf16" and (win or sink):
                        continue
                    sch = _scheme(text, win, sink)
                    for L in (int(x) for x in a.contexts.split(",")):
                        extra = [int(x) for x in a.splits.split(",") if x] if L == a.profile_context else []
                        for splits in [None] + extra:
                            if time.time() - t0 > a.budget:
                                break
                            row = dict(shape=shape, scheme=text, window=win, sink=sink, context=L,
                                       splits=splits or "default", config="", graph_ms="", error="")
                            try:
                                fn, cfg = _plan(sch, a.batch, L, s["heads_q"], s["heads_kv"], s["head_dim"], splits)
                                row["config"] = json.dumps(cfg)
                                fn()
                                row["graph_ms"] = triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median")
                                if splits is None and L == a.profile_context:
                                    for k, us, n in kernels_of(fn):
                                        wk.writerow(dict(shape=shape, scheme=text, window=win, sink=sink, kernel=k,
                                                         us_per_step=round(us, 2), calls_per_step=n))
                            except Exception as e:  # noqa: BLE001 - reported in the table
                                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                            w.writerow(row)
                            f.flush()
                            g.flush()
                            ms = f"{row['graph_ms']:.4f}" if row["graph_ms"] != "" else row["error"][:60]
                            spl = cfg.get("num_splits") if row["config"] else "?"
                            print(f"{shape:8} {text:44} fp {win:2}:{sink} ctx {L:5} splits {spl!s:>3}: {ms}",
                                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
