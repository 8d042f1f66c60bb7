"""Decode: the Gluon MMA-fragment kernel (q4_0, q8_0, fp8_e4m3, q4_1, int4_had) vs the Triton kernel and cuDNN.

    python benchmarks/bench_gluon.py --out DIR      # on the H200 (device call), ~4 min

Shapes: Hq 32, Hk 8, D 128, page 16, context 32K, batch 32 / 1 / 8 (in that order, within --budget).
For each batch: cuDNN SDPA on dense bf16 K/V (the issue's peer), kvlab's bf16 paged kernel, and per
scheme the Triton kernel at its quick-tuned config and the Gluon kernel over warps x tokens per warp x
register cap (maxnreg) x accumulator orientation (O^T or O; `_O` in the name) x split count (B = 32;
four configs at the other batches). Correctness against the float32 reference is checked first for
each scheme. Medians of triton.testing.do_bench (eager) and of CUDA-graph replays
(do_bench_cudagraph); 3 cache copies rotate so the cache is not read from L2. Writes gluon.csv and
header.json.
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
sys.path.insert(0, str(ROOT / "tests" / "kernels" / "decode"))
sys.path.insert(0, str(ROOT / "benchmarks"))

HQ, HK, D, P, CTX = 32, 8, 128, 16, 32768


SCHEMES = ("q4_0", "q8_0", "fp8_e4m3", "q4_1", "int4_had")


def check(name: str) -> dict:
    """Relative error of the Gluon kernel (every warps x tokens-per-warp config) against the reference."""
    from paged_cases import call_args, make_paged

    import kvlab
    from kvlab.kernels.decode import decode
    sch = kvlab.scheme(name)
    c = make_paged([1, 300, 517, 4000], HK, D, P, sch.k, sch.v, device="cuda")
    args, kw = call_args(c)
    q = torch.randn(4, HQ, D, device="cuda", dtype=torch.bfloat16)
    ref = decode(q.float(), *args, sch.k, sch.v, P, **kw, backend="reference")
    res = {}
    for nw in (4, 8):
        for tw in (16, 32):
            got = decode(q, *args, sch.k, sch.v, P, **kw, num_splits=3,
                         config={"kernel": "gluon", "num_warps": nw, "tokens_per_warp": tw})
            res[f"w{nw}tw{tw}"] = ((got.float() - ref).abs().max() / ref.abs().max()).item()
    return res


def main() -> None:
    import triton
    from bench_decode import copy_bandwidth, header, kv_bytes, peers

    import kvlab
    from kvlab.kernels import tuning
    from kvlab.kernels.decode import decode
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench_gluon_out")
    ap.add_argument("--batches", default="32,1,8")
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--budget", type=float, default=230.0, help="seconds; later cells are skipped")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tuning.set_cache_path(str(out / "tuned_configs.json"))
    t0 = time.time()
    bw = copy_bandwidth()
    h = header(out, bw)
    names = a.schemes.split(",")
    print(f"header {h}", flush=True)
    ok = {}
    for name in names:
        try:
            errs = check(name)
            ok[name] = max(errs.values()) < 2e-2
            print(f"check {name} gluon vs reference rel err {errs} -> {'ok' if ok[name] else 'FAILED'}", flush=True)
        except Exception as ex:  # noqa: BLE001
            ok[name] = False
            print(f"check {name} failed: {type(ex).__name__}: {str(ex)[:400]}", flush=True)
    rows = []
    f = open(out / "gluon.csv", "w", newline="")
    cols = ["variant", "batch", "context", "num_splits", "eager_ms", "graph_ms", "kv_bytes", "roofline_frac_graph",
            "x_cudnn_bf16_graph", "config", "error"]
    w = csv.DictWriter(f, fieldnames=cols)
    w.writeheader()
    bf = kvlab.scheme("bf16")
    for B in [int(x) for x in a.batches.split(",")]:
        if time.time() - t0 > a.budget:
            print(f"budget spent: batch {B} skipped", flush=True)
            continue
        shape = {"batch": B, "heads_q": HQ, "heads_kv": HK, "head_dim": D, "page_size": P, "context": CTX}
        cud_e, _, perr = peers(B, CTX)
        qd = torch.randn(B, HQ, 1, D, device="cuda", dtype=torch.bfloat16)
        kd = torch.randn(B, HK, CTX, D, device="cuda", dtype=torch.bfloat16)
        vd = torch.randn_like(kd)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def cudnn(qd=qd, kd=kd, vd=vd):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, enable_gqa=True)
        cud_g = triton.testing.do_bench_cudagraph(cudnn, rep=30, return_mode="median")
        del qd, kd, vd, cudnn
        torch.cuda.empty_cache()
        w.writerow({"variant": "cudnn_bf16_dense", "batch": B, "context": CTX, "eager_ms": cud_e, "graph_ms": cud_g,
                    "kv_bytes": 2 * B * HK * CTX * D * 2, "x_cudnn_bf16_graph": 1.0, "error": perr})
        tri_bf, _ = tuning.tune("decode", bf, shape, quick=True, save=False)
        S0 = tuning.auto_splits(B, HK)
        variants = [("bf16_paged_triton", bf, tri_bf, None)]
        for name in names:
            sch = kvlab.scheme(name)
            tri, _ = tuning.tune("decode", sch, shape, quick=True, save=False,
                                 candidates=tuning.search_space("decode", B, HK, sch.k, sch.v, "cuda", quick=True))
            variants.append((f"{name}_triton", sch, tri, None))
            if not ok.get(name):
                continue  # a kernel that failed its check is not timed
            S1, S2 = -(-3 * S0 // 4), -(-3 * S0 // 2)
            # (warps, tokens per warp, register cap, O^T, splits). O^T: 16 tokens ~155 registers (3 CTAs / SM),
            # capped at 128: 4 CTAs (8 B of stack for q4_0); 32 tokens capped at 168: 3 CTAs
            grid = [(4, 16, r, True, S) for r in (None, 128) for S in sorted({S1, S0, S2})]
            grid += [(4, 32, r, True, S) for r in (None, 168) for S in sorted({S0 // 2, S1, S0})]
            grid += [(4, 16, None, True, 1), (4, 32, None, True, 1)]  # one split: no partials, no merge launch
            grid += [(8, 32, None, True, S0), (4, 16, 168, False, S1), (4, 16, 168, False, S0),
                     (4, 32, None, False, S0 // 2)]
            if B != 32:  # the full grid at the target shape; a few configs elsewhere
                grid = [(4, 16, None, True, S0), (4, 16, 128, True, S0), (4, 32, None, True, S0),
                        (4, 16, 168, False, S0)]
            for nw, tw, r, ot, S in grid:
                variants.append((f"{name}_gluon_w{nw}_tw{tw}" + (f"_r{r}" if r else "") + ("" if ot else "_O"), sch,
                                 {"kernel": "gluon", "num_warps": nw, "tokens_per_warp": tw, "ot": ot,
                                  **({"maxnreg": r} if r else {})}, S))
        caches = {}
        for label, sch, cfg, S in variants:
            row = {"variant": label, "batch": B, "context": CTX, "config": json.dumps(cfg),
                   "kv_bytes": kv_bytes(sch, B, CTX, P)}
            if time.time() - t0 > a.budget:
                row["error"] = "skipped: time budget"
                w.writerow(row)
                continue
            try:
                if sch.name not in caches:
                    caches.clear()
                    torch.cuda.empty_cache()
                    caches[sch.name] = [(tuning.synthetic_cache(sch.k, sch.v, B, HK, D, P, CTX, "cuda", seed=i),
                                         torch.randn(B, HQ, D, device="cuda", dtype=torch.bfloat16)) for i in range(3)]
                fns = [decode(q, c["k_pages"], c["v_pages"], c["kv_indptr"], c["kv_indices"], c["kv_last_page_len"],
                              sch.k, sch.v, P, k_tensor_scale=c["k_ts"], v_tensor_scale=c["v_ts"], config=cfg,
                              num_splits=S, plan=True) for c, q in caches[sch.name]]

                def call(fns=fns):
                    for fn in fns:
                        fn()
                e = triton.testing.do_bench(call, warmup=5, rep=30, return_mode="median") / 3
                g = triton.testing.do_bench_cudagraph(call, rep=30, return_mode="median") / 3
                row.update(num_splits=S or cfg.get("num_splits"), eager_ms=e, graph_ms=g,
                           roofline_frac_graph=row["kv_bytes"] / (bw * 1e12) / (g * 1e-3), x_cudnn_bf16_graph=g / cud_g)
            except Exception as ex:  # noqa: BLE001
                row["error"] = f"{type(ex).__name__}: {str(ex)[:300]}"
            w.writerow(row)
            f.flush()
            rows.append(row)
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items() if k != "config"}, flush=True)
        caches.clear()
        torch.cuda.empty_cache()
    f.close()
    print(f"done in {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
