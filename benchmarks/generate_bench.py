"""Generation through the paged pool and kernels on the GPU (issue 19): SmolLM2 at its 8K context.

    python benchmarks/generate_bench.py --out DIR [--schemes bf16,fp8_e4m3,q8_0,q4_0,kivi4] [--batches 1,16,64]
                                        [--budget-gib 16] [--new 32] [--budget-s 420]

One process, the model loaded once (bf16 on the GPU). For each scheme and batch: a pool sized to --budget-gib
(its capacity from the pool's own accounting), chunked prefill of B copies of an (8192 - new)-token passkey
prompt, greedy decode of --new tokens through `kvlab.generate` (default kernel dispatch), passkey hits. Writes
DIR/generate.csv with the columns of sweeps/results/h200/generate.csv (bf16_decode_tokens_per_s filled from the
bf16 row of the same batch).
"""
from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--schemes", default="bf16,fp8_e4m3,q8_0,q4_0,kivi4")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--budget-gib", type=float, default=16.0)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--budget-s", type=float, default=420)
    a = ap.parse_args(argv)
    import torch

    import kvlab
    from kvlab.cache import KVPool
    from kvlab.eval.passkey import passkey_prompt
    from kvlab.generate import generate
    from kvlab.generate.__main__ import COLUMNS, page_size_for
    from kvlab.kernels.store import pool_store
    from kvlab.model import load_model
    model, tok = load_model("smollm2", device="cuda", dtype=torch.bfloat16)
    c = model.config
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    key = 73921
    ids = passkey_prompt(tok, c.max_position_embeddings - a.new, 0.5, key)
    rows, t0 = [], time.time()
    for B in (int(b) for b in a.batches.split(",")):
        for name in a.schemes.split(","):
            if time.time() - t0 > a.budget_s:
                print(f"{name} B{B}: skipped (time budget)", flush=True)
                continue
            sch = kvlab.scheme(name)
            P = page_size_for(sch)
            try:
                pool = KVPool.from_memory(a.budget_gib, sch, c.n_layers, c.n_kv_heads, c.head_dim, P, max_seqs=B,
                                          device="cuda", store=pool_store)
                generate(model, pool, ids[None, :64].repeat(B, 1).cuda(), 2, chunk=64)  # warm the kernels
                for s in list(pool.seq_ids):
                    pool.free(s)
                r = generate(model, pool, ids[None].repeat(B, 1), a.new, chunk=2048)
                hits = sum(str(key) in tok.decode(t.tolist()) for t in r["tokens"])
                row = {"scheme": name, "model": "SmolLM2-135M-Instruct", "batch": B, "context": ids.numel() + a.new,
                       "new_tokens": a.new, "kv_budget_gib": a.budget_gib,
                       "capacity_tokens": pool.n_pages * P + pool.policy.capacity * B, "prefill_s": r["prefill_s"],
                       "decode_tokens_per_s": r["decode_tokens_per_s"], "passkey_hits": hits, "passkey_trials": B,
                       "device": torch.cuda.get_device_name(), "kernels": "triton"}
                del pool
                torch.cuda.empty_cache()
            except Exception as e:  # noqa: BLE001 - one cell must not end the run
                print(f"{name} B{B}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                continue
            rows.append(row)
            print(f"{name} B{B}: capacity {row['capacity_tokens']} tokens, prefill {row['prefill_s']:.2f} s, "
                  f"decode {row['decode_tokens_per_s']:.1f} tok/s, passkey {hits}/{B}", flush=True)
    for r in rows:
        bf = next((x for x in rows if x["scheme"] == "bf16" and x["batch"] == r["batch"]), None)
        r["bf16_decode_tokens_per_s"] = bf["decode_tokens_per_s"] if bf else None
    with open(out / "generate.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
