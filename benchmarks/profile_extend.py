"""Where an extend call's time goes: torch.profiler over the default dispatch (dense prefix) and the fused kernel.

    python benchmarks/profile_extend.py [--out DIR] [--cases SHAPE:SCHEME:BACKEND,...]

Prints, per case, the wall time per call, and the CUDA and CPU self times of the top ops (key_averages).
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


DEFAULT_CASES = ("p32k_b1:bf16:auto", "p32k_b1:bf16:auto_host", "p32k_b1:q4_0:auto", "p32k_b1:q4_0:auto_host",
                 "p32k_b8:q4_0:auto_host", "smollm2_p8k:q4_0:auto_host", "p32k_b1:q4_0:triton")


def extend_case(sname: str, name: str, backend: str, out=None, device: str = "cuda", shape: dict | None = None):
    """A no-argument callable running one default-dispatch `extend` call of benchmarks/run.py's shape `sname` (or
    `shape`: a dict of the same keys) and scheme `name` on a synthetic cache on `device`; backend auto / triton / dense,
    with "_host" the lengths passed on the host."""
    import kvlab
    from run import EXTEND_SHAPES, SCHEMES, chunk_inputs, page_size
    from kvlab.kernels.autotune import synthetic_cache
    from kvlab.kernels.extend import extend
    shape = shape or EXTEND_SHAPES[sname]
    sch = kvlab.scheme(SCHEMES[name])
    B, L, C, Hq, Hk, D = (shape[k] for k in ("batch", "prefix", "chunk", "heads_q", "heads_kv", "head_dim"))
    P = page_size(sch)
    c = synthetic_cache(sch.k, sch.v, B, Hk, D, P, L, device)
    q, kn, vn, qo = chunk_inputs(B, C, Hq, Hk, D, device)
    eager = backend.endswith("_eager")  # graphs=False (batch 1 with host lengths otherwise replays a graph)
    backend = backend[:-len("_eager")] if eager else backend
    host = backend.endswith("_host")
    hl = (qo.tolist(), c["kv_indptr"].tolist(), c["kv_last_page_len"].tolist()) if host else None
    bk = backend[:-len("_host")] if host else backend

    def fn():
        return extend(q, kn, vn, qo, c["k_pages"], c["v_pages"], c["kv_indptr"], c["kv_indices"],
                      c["kv_last_page_len"], sch.k, sch.v, P, k_tensor_scale=c["k_ts"], v_tensor_scale=c["v_ts"],
                      max_qo_len=C, backend=bk, host_lens=hl, out=out, graphs=not eager)
    return fn


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES),
                    help="shape:scheme:backend triples (backend auto, auto_host, auto_host_eager, triton, dense, dense_host)")
    a = ap.parse_args()
    from torch.profiler import ProfilerActivity, profile
    lines = []
    for sname, name, backend in (c.split(":") for c in a.cases.split(",")):
        fn = extend_case(sname, name, backend)
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) / 10 * 1e3
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
        from kvlab.kernels.extend import dense
        head = f"== {sname} {name} {backend}: wall {wall:.3f} ms/call; dense attention used: {dense._ATTN}"
        tab = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=14, max_name_column_width=60)
        tab2 = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10, max_name_column_width=60)
        lines += [head, tab, tab2]
        print(head, tab, tab2, sep="\n", flush=True)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "profile_extend.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
