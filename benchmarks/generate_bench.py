"""Generation through the paged pool and kernels on the GPU (issue 19): SmolLM2 at its 8K context.

    python benchmarks/generate_bench.py --out DIR [--schemes bf16,fp8_e4m3,q8_0,q4_0,kivi4] [--batches 64,16,1]
                                        [--budget-gib 16] [--new 64] [--budget-s 540] [--compile-batches 64]
                                        [--eager-rows bf16,q4_0] [--serve 96]

One process, the model loaded once (bf16 on the GPU). For each batch and scheme: a pool sized to --budget-gib
(its capacity from the pool's own accounting), chunked prefill of B copies of an (8192 - new)-token passkey
prompt, greedy decode of --new tokens through `kvlab.generate.generate` (default kernel dispatch, each decode
step one CUDA-graph replay; at the batches of --compile-batches the model's dense parts go through
torch.compile), passkey hits. --eager-rows: those schemes also at the largest batch with decode steps run
eagerly (no graph, no compile), to show what the graph buys. --serve N: continuous batching, N requests of
1K..7K-token prompts and 16..128 new tokens over 32 slots, for bf16 and q4_0 (`kvlab.generate.Batcher`).
Writes DIR/generate.csv (the columns of sweeps/results/h200/generate.csv; bf16_decode_tokens_per_s from the
bf16 row of the same batch and mode) and DIR/serve.csv; a row is written as soon as it is measured.
"""
from __future__ import annotations

import argparse
import csv
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EXTRA = ["mode", "steps", "decode_ms_per_step", "graphs"]
SERVE = ["scheme", "model", "slots", "requests", "prompt_tokens", "new_tokens", "capacity_tokens", "wall_s",
         "prefill_s", "decode_tokens_per_s", "total_tokens_per_s", "steps", "mean_busy_slots", "graphs", "device"]


def _write(path: Path, cols, rows) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)


def _profile(model, pool, seq_ids, path: Path, max_tokens: int) -> None:
    """GPU time per kernel over 5 more decode steps of the sequences in `pool` (slots = their rows), each one
    graph replay, as CUPTI sees the graph's kernels: where a step's time goes."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from kvlab.generate import Batcher
    b = Batcher(model, pool, slots=len(seq_ids), max_tokens=max_tokens + 64, keep=True)
    b._capture()
    slots = {pool._seq(s).row: s for s in seq_ids}
    for _ in range(2):
        b.step.plan(slots)
        b._decode_step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            b.step.plan(slots)
            b._decode_step()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70)
    path.write_text(table)
    print(f"profile {path.name}:\n" + "\n".join(table.splitlines()[:16]), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--schemes", default="bf16,fp8_e4m3,q8_0,q4_0,kivi4")
    ap.add_argument("--batches", default="64,16,1")
    ap.add_argument("--budget-gib", type=float, default=16.0)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--budget-s", type=float, default=540)
    ap.add_argument("--compile-batches", default="64")
    ap.add_argument("--eager-rows", default="bf16,q4_0")
    ap.add_argument("--serve", type=int, default=96)
    ap.add_argument("--profile", default="bf16,q4_0",
                    help="schemes whose graph+compile rows also get a kernel profile of 5 replayed steps")
    a = ap.parse_args(argv)
    import torch

    import kvlab
    from kvlab.cache import KVPool
    from kvlab.eval.passkey import passkey_prompt
    from kvlab.eval.perplexity import text_tokens
    from kvlab.generate import Batcher, generate
    from kvlab.generate.__main__ import COLUMNS, page_size_for
    from kvlab.kernels.store import pool_store
    from kvlab.model import load_model
    model, tok = load_model("smollm2", device="cuda", dtype=torch.bfloat16)
    c = model.config
    dev = torch.cuda.get_device_name()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    key = 73921
    ids = passkey_prompt(tok, c.max_position_embeddings - a.new, 0.5, key)
    batches = [int(b) for b in a.batches.split(",")]
    comp = {int(b) for b in a.compile_batches.split(",") if b}
    plan = [(B, name, "graph+compile" if B in comp else "graph") for B in batches for name in a.schemes.split(",")]
    plan += [(max(batches), name, "eager") for name in a.eager_rows.split(",") if name]
    rows, t0 = [], time.time()
    compiled = None  # the torch.compile'd dense parts, made once

    def pool_for(sch, B):
        return KVPool.from_memory(a.budget_gib, sch, c.n_layers, c.n_kv_heads, c.head_dim, page_size_for(sch),
                                  max_seqs=B, device="cuda", store=pool_store)

    for B, name, mode in plan:
        if time.time() - t0 > a.budget_s:
            print(f"{name} B{B} {mode}: skipped (time budget)", flush=True)
            continue
        sch = kvlab.scheme(name)
        P = page_size_for(sch)
        try:
            if mode == "graph+compile" and compiled is None:
                compiled = model.compile_decode()._step_fns
            model._step_fns = compiled if mode == "graph+compile" else None
            pool = pool_for(sch, B)
            generate(model, pool, ids[None, :64].repeat(B, 1).cuda(), 3, chunk=64,
                     graphs=mode != "eager")  # compile every kernel once
            for s in list(pool.seq_ids):
                pool.free(s)
            r = generate(model, pool, ids[None].repeat(B, 1), a.new, chunk=2048, graphs=mode != "eager")
            if mode == "graph+compile" and name in a.profile.split(","):
                _profile(model, pool, r["seq_ids"], out / f"profile_{name}_B{B}.txt", c.max_position_embeddings)
            hits = sum(str(key) in tok.decode(t.tolist()) for t in r["tokens"])
            row = {"scheme": name, "model": "SmolLM2-135M-Instruct", "batch": B, "context": ids.numel() + a.new,
                   "new_tokens": a.new, "kv_budget_gib": a.budget_gib,
                   "capacity_tokens": pool.n_pages * P + pool.policy.capacity * B, "prefill_s": r["prefill_s"],
                   "decode_tokens_per_s": r["decode_tokens_per_s"], "passkey_hits": hits, "passkey_trials": B,
                   "device": dev, "kernels": "triton", "mode": mode, "steps": a.new - 1,
                   "decode_ms_per_step": 1e3 * r["decode_s"] / (a.new - 1), "graphs": r["graphs"]}
            del pool
            torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001 - one cell must not end the run
            import traceback
            traceback.print_exc(limit=6)
            print(f"{name} B{B} {mode}: {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        rows.append(row)
        for r_ in rows:
            bf = next((x for x in rows if x["scheme"] == "bf16" and x["batch"] == r_["batch"]
                       and x["mode"] == r_["mode"]), None)
            r_["bf16_decode_tokens_per_s"] = bf["decode_tokens_per_s"] if bf else None
        _write(out / "generate.csv", COLUMNS + EXTRA, rows)
        print(f"{name} B{B} {mode}: capacity {row['capacity_tokens']} tokens, prefill {row['prefill_s']:.2f} s, "
              f"decode {row['decode_tokens_per_s']:.1f} tok/s ({row['decode_ms_per_step']:.2f} ms/step), "
              f"passkey {hits}/{B}", flush=True)

    serve = []
    text = text_tokens(tok, "pydoc")
    for name in ("bf16", "q4_0") if a.serve else ():
        if time.time() - t0 > a.budget_s:
            print(f"serve {name}: skipped (time budget)", flush=True)
            continue
        try:
            sch = kvlab.scheme(name)
            rng = random.Random(0)
            pool = pool_for(sch, 32)
            b = Batcher(model, pool, slots=32)
            lens = [(rng.randint(1024, 7168), rng.randint(16, 128)) for _ in range(a.serve)]
            for n, m in lens:
                off = rng.randint(0, text.numel() - n - 1)
                b.submit(text[off:off + n], m)
            t1 = time.perf_counter()
            r = b.run()
            wall = time.perf_counter() - t1
            row = {"scheme": name, "model": "SmolLM2-135M-Instruct", "slots": 32, "requests": a.serve,
                   "prompt_tokens": sum(n for n, _ in lens), "new_tokens": sum(m for _, m in lens),
                   "capacity_tokens": pool.n_pages * page_size_for(sch) + pool.policy.capacity * 32, "wall_s": wall,
                   "prefill_s": r["prefill_s"], "decode_tokens_per_s": r["decode_tokens_per_s"],
                   "total_tokens_per_s": sum(n + m for n, m in lens) / wall, "steps": r["steps"],
                   "mean_busy_slots": r["mean_busy_slots"], "graphs": r["graphs"], "device": dev}
            serve.append(row)
            _write(out / "serve.csv", SERVE, serve)
            print(f"serve {name}: {a.serve} requests in {wall:.1f} s, decode {row['decode_tokens_per_s']:.0f} tok/s, "
                  f"{r['steps']} steps, {r['mean_busy_slots']:.1f} busy slots", flush=True)
            del pool, b
            torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001
            import traceback
            traceback.print_exc(limit=6)
            print(f"serve {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)


if __name__ == "__main__":
    main()
