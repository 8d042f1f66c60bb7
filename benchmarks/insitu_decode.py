"""Decode at SmolLM2's generation shape (B 64 x 8K, Hq 9, Hk 3, D 64): the same kernel and config over three
prefixes, to find why a decode step inside generation ran slower than the benchmark's synthetic cache.

    python benchmarks/insitu_decode.py [--schemes bf16,q8_0,q4_0] [--batch 64] [--context 8192]

Prefixes: `pool+fp0` (as `pool`, with the pool's full-precision buffers passed, empty here), `pool` (a 16 GiB KVPool for 30 layers, every sequence appended in 2,048-token chunks as the chunked
prefill does, its block table as `pool.block_table` builds it), `pool_views` (the same table held in views
at DecodeStep's offsets of one int32 buffer), `synthetic` (autotune.synthetic_cache: pages in random order,
random codes). Each timed by CUDA-graph replay (triton.testing.do_bench_cudagraph, median), for the default
dispatch and for explicit configs.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--schemes", default="bf16,q8_0,q4_0")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=8192)
    a = ap.parse_args(argv)
    import torch
    import triton.testing

    import kvlab
    from kvlab.cache import KVPool
    from kvlab.kernels.autotune import synthetic_cache
    from kvlab.kernels.configs import GluonDecodeConfig, TritonDecodeConfig
    from kvlab.kernels.decode import decode
    from kvlab.kernels.store import pool_store
    B, Hq, Hk, D, ctx = a.batch, 9, 3, 64, a.context
    q = torch.randn(B, Hq, D, device="cuda", dtype=torch.bfloat16)
    configs = {"default": None, "triton64x4": TritonDecodeConfig(block_n=64, num_warps=4, num_splits=4),
               "gluon4x32": GluonDecodeConfig(num_warps=4, tokens_per_warp=32)}
    print(f"{'scheme':10s} {'prefix':11s} " + " ".join(f"{k:>11s}" for k in configs), flush=True)
    for name in a.schemes.split(","):
        sch = kvlab.scheme(name)
        pool = KVPool.from_memory(16.0, sch, 30, Hk, D, 16, max_seqs=B, device="cuda", store=pool_store)
        seqs = [pool.add_sequence(row=b) for b in range(B)]
        g = torch.Generator(device="cuda").manual_seed(0)
        for c0 in range(0, ctx, 2048):
            for s in seqs:
                n = min(2048, ctx - c0)
                k = torch.randn(n, Hk, D, device="cuda", dtype=torch.bfloat16, generator=g)
                pool.append(s, 0, k, torch.randn_like(k))
        bt = pool.block_table(seqs, 0)
        buf = torch.zeros(5 * B + B * 600 + 7, dtype=torch.int32, device="cuda")
        o = 5 * B + 1  # odd offsets, as DecodeStep's views
        ip = buf[o:o + B + 1]
        ip.copy_(bt.kv_indptr)
        last = buf[o + B + 1:o + 2 * B + 1]
        last.copy_(bt.kv_last_page_len)
        ind = buf[o + 2 * B + 1:o + 2 * B + 1 + bt.kv_indices.numel()]
        ind.copy_(bt.kv_indices)
        lc = pool.layer_cache(0)
        syn = synthetic_cache(sch.k, sch.v, B, Hk, D, 16, ctx, "cuda")
        prefixes = {"pool": (lc.k_pages, lc.v_pages, bt.kv_indptr, bt.kv_indices, bt.kv_last_page_len),
                    "pool_views": (lc.k_pages, lc.v_pages, ip, ind, last),
                    "synthetic": (syn["k_pages"], syn["v_pages"], syn["kv_indptr"], syn["kv_indices"],
                                  syn["kv_last_page_len"])}
        fp0 = dict(k_fp=pool.k_fp[0][:B], v_fp=pool.v_fp[0][:B], fp_len=torch.zeros(B, dtype=torch.int32,
                                                                                    device="cuda"))
        prefixes["pool+fp0"] = prefixes["pool"]  # with the pool's (empty) full-precision buffers, as generation
        for pname, args in prefixes.items():
            cells = []
            for cname, cfg in configs.items():
                try:
                    kw = fp0 if pname == "pool+fp0" else {}
                    fn = decode(q, *args, sch.k, sch.v, 16, config=cfg, plan=True, **kw)
                    cells.append(f"{triton.testing.do_bench_cudagraph(fn, rep=50, return_mode='median'):11.4f}")
                except Exception as e:  # noqa: BLE001 - a config that does not run this scheme
                    cells.append(f"{type(e).__name__[:11]:>11s}")
            print(f"{name:10s} {pname:11s} " + " ".join(cells), flush=True)
        del pool, syn
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
