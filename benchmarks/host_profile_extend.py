"""Where an extend call's host (Python) time goes: cProfile over repeated default-dispatch calls.

    python benchmarks/host_profile_extend.py [--out DIR] [--cases SHAPE:SCHEME:BACKEND,...] [--calls N]

Per case: the wall ms per call with the GPU synchronized once at the end (the host's rate when it runs ahead) and the
top functions by own time and by cumulative time. Complements profile_extend.py (the GPU side).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--cases", default="p8k_b1:bf16:auto_host,smollm2_p8k:bf16:auto_host,p8k_b1:q4_0:auto_host")
    ap.add_argument("--calls", type=int, default=50)
    a = ap.parse_args()
    from profile_extend import extend_case
    lines = []
    for sname, name, backend in (c.split(":") for c in a.cases.split(",")):
        fn = extend_case(sname, name, backend)
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(a.calls):
            fn()
        host_ms = (time.perf_counter() - t) / a.calls * 1e3
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) / a.calls * 1e3
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(a.calls):
            fn()
        pr.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        st = pstats.Stats(pr, stream=s)
        st.sort_stats("tottime").print_stats(22)
        st.sort_stats("cumulative").print_stats(30)
        head = (f"== {sname} {name} {backend}: host {host_ms:.3f} ms/call before the sync, wall {wall:.3f} ms/call "
                f"({a.calls} calls)")
        body = "\n".join(ln for ln in s.getvalue().splitlines() if ln.strip())
        lines += [head, body]
        print(head, flush=True)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "host_profile_extend.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
