"""The Gluon decode with its split merge fused into the last program (one launch) against the separate merge kernel
(two launches), and the fixed cost per call: graph-replayed medians through the default-dispatch config of each
shape, with only `fused_merge` changed, in one process.

    python benchmarks/fused_merge_bench.py --out DIR [--schemes q4_0,kivi4,int2,fp8_e4m3] [--contexts 32768,1024]
                                            [--batches 1,32]

Writes DIR/fused_merge.csv: scheme, batch, context, splits, fused_ms, separate_ms, ratio (fused / separate),
cudnn_bf16_ms (the peer at the same shape), config. A context of 1K at batch 1 is close to the fixed cost of a call.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main(argv=None) -> None:
    import triton

    import kvlab
    from kvlab.eval.speed import fp_tokens_of
    from kvlab.kernels.autotune import synthetic_cache
    from kvlab.kernels.checks import check_prefix
    from kvlab.kernels.configs import GluonDecodeConfig
    from kvlab.kernels.decode import api, gluon
    from run import SCHEMES, page_size, peers
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--schemes", default="q4_0,kivi4,int2,fp8_e4m3")
    ap.add_argument("--contexts", default="32768,1024")
    ap.add_argument("--batches", default="1,32")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for B in (int(x) for x in a.batches.split(",")):
        for L in (int(x) for x in a.contexts.split(",")):
            shape = dict(batch=B, context=L, heads_q=32, heads_kv=8, head_dim=128)
            cudnn = peers(shape)[0]
            for name in a.schemes.split(","):
                sch = kvlab.scheme(SCHEMES[name])
                P = page_size(sch)
                c = synthetic_cache(sch.k, sch.v, B, 8, 128, P, L, "cuda")
                W = fp_tokens_of(sch)
                fp = [None, None, None]
                if W:
                    fp = [torch.randn(B, 8, W, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2)] + [
                        torch.full((B,), W, dtype=torch.int32, device="cuda")]
                q = torch.randn(B, 32, 128, device="cuda", dtype=torch.bfloat16)
                kv = check_prefix(q, c["k_pages"], c["v_pages"], c["kv_indptr"], c["kv_indices"],
                                  c["kv_last_page_len"], sch.k, sch.v, P, *fp, c["k_ts"], c["v_ts"], B)
                _, cfg = api.resolve(q, kv)
                if not isinstance(cfg, GluonDecodeConfig):
                    print(f"{name} B{B} L{L}: default is {cfg.kernel}, skipped", flush=True)
                    continue
                res = {}
                for fused in (True, False):
                    fn = gluon.run(q, kv, 128 ** -0.5, cfg.replace(fused_merge=fused), plan=True)
                    fn()
                    res[fused] = triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median")
                row = dict(scheme=name, batch=B, context=L, splits=cfg.num_splits, fused_ms=res[True],
                           separate_ms=res[False], ratio=res[True] / res[False], cudnn_bf16_ms=cudnn,
                           config=cfg.to_dict())
                rows.append(row)
                print(f"{name} B{B} L{L} S{cfg.num_splits}: fused {res[True]:.4f} ms, separate {res[False]:.4f} ms, "
                      f"cuDNN {cudnn:.4f}", flush=True)
    with open(out / "fused_merge.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
