"""Batch-1 extend through CUDA graphs (`kvlab/kernels/extend/graphs.py`): replayed call time with the chunk in cuDNN
(the default inside a graph) or in flash varlen, the graph counts of each cell (a failed capture stays eager), and the
wall time of each call of a fresh-length sequence (two eager calls, the capture, replays).

    python benchmarks/graph_probe.py [--shapes smollm2_p8k,p8k_b1] [--schemes bf16,fp8_e4m3,...] [--out DIR]

A/B variants are fixed dispatch changes (`extend.api.GRAPH_CUDNN_CHUNK_MIN_FLOPS` patched for the chunk), not what
a user gets; they say which one ships. Prints one line per cell; writes graph_probe.txt under --out.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="smollm2_p8k,p8k_b1")
    ap.add_argument("--schemes", default="bf16,fp8_e4m3,q8_0,q4_0,nf4,mxfp4")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import triton

    from profile_extend import extend_case
    from run import EXTEND_SHAPES, extend_peers
    from kvlab.kernels.extend import api as ext_api
    from kvlab.kernels.extend import graphs
    lines = []
    default = ext_api.GRAPH_CUDNN_CHUNK_MIN_FLOPS
    for sname in a.shapes.split(","):
        cudnn = extend_peers(EXTEND_SHAPES[sname])[0]
        for name in a.schemes.split(","):
            res = []
            for chunk in ("cudnn", "flash"):
                ext_api.GRAPH_CUDNN_CHUNK_MIN_FLOPS = default if chunk == "cudnn" else float("inf")
                graphs.clear()
                graphs.STATS.clear()
                fn = extend_case(sname, name, "auto_host")
                walls = []
                for _ in range(6):
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                    fn()
                    torch.cuda.synchronize()
                    walls.append((time.perf_counter() - t) * 1e3)
                ms = triton.testing.do_bench(fn, warmup=5, rep=60, return_mode="median")
                res.append(f"{chunk} {ms:.3f} ms (x{ms / cudnn:.2f}) calls {' '.join(f'{w:.1f}' for w in walls)} "
                           f"{dict(graphs.STATS)}")
            ext_api.GRAPH_CUDNN_CHUNK_MIN_FLOPS = default
            line = f"== {sname} {name} cuDNN {cudnn:.3f}: " + " | ".join(res)
            print(line, flush=True)
            lines.append(line)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "graph_probe.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
