"""The Gluon decode kernel at fixed configs (no tuning), graph-replayed: an A/B of two kernel trees in turn.

    python benchmarks/decode_configs.py --tag new --schemes q4_0,q8_0 --shape b32 \
        --configs "tw32:s3:r168,tw16:s3,tw32:s3"
    PYTHONPATH=/path/to/old/tree python benchmarks/decode_configs.py --tag old ...   # the same cells, other kernel

A config is `tw{16|32}:s{splits}[:r{maxnreg}][:w{warps}][:f][:pf|:np][:u][:l{n}][:t]` (f: fused merge; pf / np:
the register prefetch on / off, else the kernel's default; u: the prefetching tile loop unrolled by two; l{n}: the L2
prefetch n tiles ahead; t: the scores transposed, S^T = K Q^T), or `default`: the public `decode` with its default
dispatch (whichever kernel it picks; the line names it). Prints one line per cell:
`cfg <tag> <scheme> <config> <graph-replayed median ms>` and the kvlab file it imported, so two runs in one
session (one per tree, on one warm GPU) compare the kernels at equal configs.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "benchmarks"))  # run.py's tables (after any PYTHONPATH tree)


def parse_config(text: str):
    """`tw32:s3:r168` -> GluonDecodeConfig; a clear error for anything else."""
    from kvlab.kernels.configs import GluonDecodeConfig
    kw = dict(tokens_per_warp=16, num_splits=1, num_warps=4, maxnreg=None, fused_merge=False)
    for part in text.split(":"):
        if part.startswith("tw") and part[2:].isdigit():
            kw["tokens_per_warp"] = int(part[2:])
        elif part.startswith("s") and part[1:].isdigit():
            kw["num_splits"] = int(part[1:])
        elif part.startswith("r") and part[1:].isdigit():
            kw["maxnreg"] = int(part[1:])
        elif part.startswith("w") and part[1:].isdigit():
            kw["num_warps"] = int(part[1:])
        elif part == "f":
            kw["fused_merge"] = True
        elif part in ("pf", "np"):
            kw["prefetch"] = part == "pf"
        elif part == "u":  # the prefetching loop unrolled by two (needs the prefetch: pf is implied)
            kw["unroll"] = True
        elif part.startswith("l") and part[1:].isdigit():  # the L2 prefetch, n tiles ahead
            kw["l2_prefetch"] = int(part[1:])
        elif part == "t":  # the scores transposed (config scores_t)
            kw["scores_t"] = True
        else:
            raise SystemExit(f"config {text!r}: unknown part {part!r}; allowed: tw16|tw32, sN, rN, wN, f, pf, np, u, lN, t")
    if kw.get("unroll"):
        if kw.get("prefetch") is False:
            raise SystemExit(f"config {text!r}: u unrolls the prefetching loop; it cannot go with np")
        kw["prefetch"] = True
    return GluonDecodeConfig(**kw)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tag", required=True)
    ap.add_argument("--schemes", required=True)
    ap.add_argument("--shape", default="b32")
    ap.add_argument("--configs", required=True)
    a = ap.parse_args()
    import triton

    import kvlab
    from kvlab.kernels.autotune import synthetic_cache
    from kvlab.kernels.checks import check_prefix
    from kvlab.kernels.decode import gluon
    from run import SCHEMES, SHAPES, page_size
    print(f"cfg {a.tag} imports {kvlab.__file__}", flush=True)
    shape = SHAPES[a.shape]
    B, L, Hq, Hk, D = (shape[k] for k in ("batch", "context", "heads_q", "heads_kv", "head_dim"))
    configs = [(c, None if c == "default" else parse_config(c)) for c in a.configs.split(",")]
    for name in a.schemes.split(","):
        sch = kvlab.scheme(SCHEMES.get(name, name))
        P = page_size(sch)
        c = synthetic_cache(sch.k, sch.v, B, Hk, D, P, L, "cuda")
        q = torch.randn(B, Hq, D, device="cuda", dtype=torch.bfloat16)
        kv = check_prefix(q, c["k_pages"], c["v_pages"], c["kv_indptr"], c["kv_indices"], c["kv_last_page_len"],
                          sch.k, sch.v, P, None, None, None, c["k_ts"], c["v_ts"], B)
        for text, cfg in configs:
            if cfg is None:  # the public decode, default dispatch
                from kvlab.kernels.decode import decode, last_dispatch
                fn = decode(q, c["k_pages"], c["v_pages"], c["kv_indptr"], c["kv_indices"], c["kv_last_page_len"],
                            sch.k, sch.v, P, k_tensor_scale=c["k_ts"], v_tensor_scale=c["v_ts"], plan=True)
                fn()
                ms = triton.testing.do_bench_cudagraph(fn, rep=40, return_mode="median")
                d = last_dispatch()
                print(f"cfg {a.tag} {name} default {ms:.4f} ({d.get('source')}: {d.get('config')})", flush=True)
                continue
            why = gluon.why_not(q, kv, cfg)
            if why:
                print(f"cfg {a.tag} {name} {text} skipped: {why}", flush=True)
                continue
            fn = gluon.run(q, kv, D ** -0.5, cfg, plan=True)
            fn()
            ms = triton.testing.do_bench_cudagraph(fn, rep=40, return_mode="median")
            print(f"cfg {a.tag} {name} {text} {ms:.4f}", flush=True)
        del c, kv
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
