"""The model's own prefill through the paged pool (store + extend, chunk by chunk), per cache scheme.

    python benchmarks/prefill_bench.py --out DIR [--lens 8192,32768] [--schemes bf16,q4_0,...] [--chunk 2048]

A SmolLM2-135M-shaped decoder (30 layers, Hq 9, Hk 3, head_dim 64, hidden 576) with random weights: prefill
time does not depend on the weights' values, so no GGUF has to travel to the GPU machine; `python -m
kvlab.generate --max-position ...` times the real model the same way. Per scheme: one warm-up generate on a
4K-token prompt (Triton compiles), then the timed prompts, then the longest prompt again ("repeat": every compile and
cuDNN plan of the dense-prefix path, where extend's dispatch takes it, cached). Writes prefill.csv (scheme, prompt_tokens, chunk,
prefill_s, tokens_per_s, run) beside a header.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCHEMES = {"bf16": "bf16", "fp8_e4m3": "fp8_e4m3", "q8_0": "q8_0", "q4_0": "q4_0", "kivi4": "kivi4",
           "int3": "int3:g32:asym", "nvfp4": "nvfp4"}


def smollm2_like(device: str):
    """A random-weight decoder with SmolLM2-135M's shapes (float32 weights, as `python -m kvlab.generate` loads)."""
    from kvlab.model.config import LlamaConfig
    from kvlab.model.llama import LlamaModel
    c = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, n_layers=30, n_heads=9, n_kv_heads=3,
                    head_dim=64, rope_theta=1e5, rms_norm_eps=1e-5, max_position_embeddings=8192,
                    tie_word_embeddings=True)
    torch.manual_seed(0)
    m = LlamaModel(c)
    for name, p in m.named_parameters():
        if name.endswith("norm.weight") or "layernorm" in name:
            p.data.fill_(1.0)
        else:
            p.data.normal_(0.0, 0.02)
    return m.to(device).eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--lens", default="8192,32768")
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--budget-s", type=float, default=300.0)
    a = ap.parse_args()
    from kvlab.cache import KVPool
    from kvlab.generate.__main__ import page_size_for
    from kvlab.generate.run import generate
    from kvlab.kernels.store import pool_store
    from kvlab.spec import as_scheme
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    import triton
    (out / "prefill_header.json").write_text(json.dumps(
        {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
         "commit": os.environ.get("KVLAB_COMMIT", "unknown"), "command": "python benchmarks/prefill_bench.py "
         + " ".join(sys.argv[1:]), "model": "SmolLM2-135M shapes, random weights, float32",
         "dense_attention": os.environ.get("KVLAB_DENSE_ATTN", "default")}, indent=1) + "\n")
    model = smollm2_like("cuda")
    c = model.config
    lens = [int(x) for x in a.lens.split(",")]
    vocab = torch.Generator().manual_seed(1)
    f = open(out / "prefill.csv", "w", newline="")
    w = csv.DictWriter(f, fieldnames=["scheme", "prompt_tokens", "chunk", "prefill_s", "tokens_per_s", "run",
                                      "dense_attention", "error"])
    w.writeheader()
    t_start = time.time()
    for name in a.schemes.split(","):
        sch = as_scheme(SCHEMES.get(name, name))
        P = page_size_for(sch)
        try:
            pool = KVPool.from_memory(6.0, sch, c.n_layers, c.n_kv_heads, c.head_dim, P, max_seqs=1, device="cuda",
                                      store=pool_store)
        except Exception as e:  # noqa: BLE001 - reported
            w.writerow({"scheme": name, "error": f"{type(e).__name__}: {str(e)[:200]}"})
            continue
        runs = [("warmup", 4096)] + [("timed", n) for n in lens] + [("repeat", max(lens))]
        for run, n in runs:
            if time.time() - t_start > a.budget_s:
                w.writerow({"scheme": name, "prompt_tokens": n, "run": run, "error": "skipped: time budget"})
                continue
            ids = torch.randint(0, c.vocab_size, (1, n), generator=vocab)
            row = {"scheme": name, "prompt_tokens": n, "chunk": a.chunk, "run": run,
                   "dense_attention": os.environ.get("KVLAB_DENSE_ATTN", "default")}
            try:
                r = generate(model, pool, ids, 1, a.chunk, "triton", graphs=False, max_position=n + 8)
                for s in r["seq_ids"]:
                    pool.free(s)
                row.update(prefill_s=r["prefill_s"], tokens_per_s=n / r["prefill_s"])
            except Exception as e:  # noqa: BLE001 - one failing cell must not end the run
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            w.writerow(row)
            f.flush()
            print("prefill", {k: row.get(k) for k in ("scheme", "prompt_tokens", "run", "prefill_s", "error")},
                  flush=True)
        del pool
        torch.cuda.empty_cache()
    f.close()


if __name__ == "__main__":
    main()
