"""python -m kvlab.generate --scheme q4_0 [--budget-gib 1] [--batch 1] [--prompt TEXT | --prompt-len N]
                           [--new-tokens 32] [--chunk 2048] [--device cpu|cuda] [--kernels triton|reference]
                           [--graphs | --no-graphs] [--compile] [--requests N] [--check] [--passkey] [--csv FILE]

Generate text through a real paged KV cache: a `KVPool` sized to the memory budget (its own accounting gives
the context that fits), chunked prefill through the store and extend kernels, one decode step per token
through store + decode (`kvlab.cache.DecodeStep` + `kvlab.generate.StepBackend`; on CUDA each step is one
CUDA-graph replay unless --no-graphs; --compile runs the model's dense layer parts through torch.compile).
Prints capacity, prefill time, decode tokens/s and the text; --check also generates with the decode-faithful
simulation (kvlab.eval) and reports where the two first differ and the simulation's logit margin there (a
quantized forward is chaotic: near-ties flip); --passkey hides a 5-digit key in the prompt (kvlab.eval.passkey)
and reports whether it is retrieved. --requests N serves N requests by continuous batching over --batch slots
(`kvlab.generate.Batcher`): prompts of --prompt-len/2 .. --prompt-len pydoc tokens, --new-tokens/2 ..
--new-tokens new tokens each; it reports throughput and per-request latency instead of one text.
With --csv, appends one row (the columns of sweeps/results/h200/generate.csv).
"""
from __future__ import annotations

import argparse
import csv
import os
import sys

COLUMNS = ["scheme", "model", "batch", "context", "new_tokens", "kv_budget_gib", "capacity_tokens", "prefill_s",
           "decode_tokens_per_s", "bf16_decode_tokens_per_s", "passkey_hits", "passkey_trials", "device", "kernels"]


def page_size_for(sch) -> int:
    """16, or the lcm with the channel groups of the scheme's channel-axis specs (layer and head overrides too)
    when larger (pages hold whole token groups)."""
    import math
    p = 16
    for s in (sch.k, sch.v, *(s for _, ks, vs in sch.overrides for s in (ks, vs)),
              *(s for *_, ks, vs in sch.head_overrides for s in (ks, vs))):
        if s.axis == "chan":
            p = p * s.group // math.gcd(p, s.group)
    return p


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvlab.generate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scheme", required=True, help="scheme text or preset (q4_0, kivi4, fp8_e4m3, ...)")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--budget-gib", type=float, default=1.0, help="memory for the KV cache (pages + fp buffers)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt", default=None, help="prompt text (default: the first --prompt-len pydoc tokens)")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--chunk", type=int, default=2048, help="prefill chunk in tokens")
    p.add_argument("--max-position", type=int, default=None,
                   help="allow prompts past the model's trained context (RoPE extrapolates: for timing long prompts, "
                        "e.g. a 32K-token prefill on SmolLM2, not for quality; the pydoc text repeats to fill it)")
    p.add_argument("--device", default="cuda" if _cuda() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--kernels", default="triton", choices=["triton", "reference"])
    p.add_argument("--graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="capture decode steps in a CUDA graph (default: on CUDA)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model's dense layer parts for decode")
    p.add_argument("--requests", type=int, default=0, help="serve N requests by continuous batching")
    p.add_argument("--check", action="store_true", help="compare with the decode-faithful simulation")
    p.add_argument("--passkey", action="store_true", help="passkey retrieval at --prompt-len tokens")
    p.add_argument("--csv", default=None, help="append a result row to this CSV")
    return p


def _cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    import torch

    from ..cache import KVPool
    from ..eval.perplexity import text_tokens
    from ..model import load_model
    from ..spec import as_scheme
    from .run import generate
    try:
        sch = as_scheme(a.scheme)
        for name, v, lo in (("--batch", a.batch, 1), ("--new-tokens", a.new_tokens, 1), ("--prompt-len", a.prompt_len, 1),
                            ("--chunk", a.chunk, 1)):
            if v < lo:
                raise ValueError(f"{name} must be >= {lo}, got {v}")
        if a.graphs and a.device != "cuda":
            raise ValueError("--graphs needs --device cuda")
        if a.requests < 0:
            raise ValueError(f"--requests must be >= 0, got {a.requests}")
        if a.device == "cpu" and a.kernels == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("the Triton kernels run on the CPU only under TRITON_INTERPRET=1; use --kernels "
                             "reference or set it")
        model, tok = load_model(a.model, device=a.device)
        c = model.config
        if a.compile:
            model.compile_decode()
        if a.requests:
            return _serve(a, model, tok, sch)
        key = None
        if a.passkey:
            from ..eval.passkey import passkey_prompt
            key = 40000 + 7919 * a.batch % 59999
            ids = passkey_prompt(tok, a.prompt_len, 0.5, key)
        elif a.prompt:
            ids = torch.tensor(tok.encode(a.prompt).ids, dtype=torch.long)
        else:
            ids = text_tokens(tok, "pydoc")
            ids = ids.repeat(-(-a.prompt_len // ids.numel()))[: a.prompt_len]
        ctx = a.max_position or c.max_position_embeddings
        if ids.numel() + a.new_tokens > ctx:
            raise ValueError(f"{ids.numel()} prompt + {a.new_tokens} new tokens exceed the model's context of {ctx}"
                             + ("" if a.max_position else " (--max-position times longer prompts)"))
        P = page_size_for(sch)
        pool = KVPool.from_memory(a.budget_gib, sch, c.n_layers, c.n_kv_heads, c.head_dim, P, max_seqs=a.batch,
                                  device=a.device, store=_store(a.kernels))
        cap = pool.n_pages * P + pool.policy.capacity * a.batch
        need_pages = a.batch * -(-(ids.numel() + a.new_tokens) // P)
        if need_pages > pool.n_pages:
            raise ValueError(f"{a.budget_gib} GiB holds {pool.n_pages} pages of {P} tokens ({cap} tokens with the "
                             f"fp buffers); {a.batch} x {ids.numel() + a.new_tokens} tokens need {need_pages}")
        r = generate(model, pool, ids[None].repeat(a.batch, 1), a.new_tokens, a.chunk, a.kernels, graphs=a.graphs,
                     max_position=a.max_position)
    except (ValueError, FileNotFoundError) as e:
        print(f"python -m kvlab.generate: error: {e}", file=sys.stderr)
        return 2
    text = tok.decode(r["tokens"][0].tolist())
    print(f"scheme {sch} on {a.model} ({a.device}, {a.kernels} kernels): {a.budget_gib} GiB holds {cap} tokens "
          f"({pool.n_pages} pages of {P}, {pool.bytes_per_token():.0f} bytes per token over all layers)")
    print(f"prefill {a.batch} x {ids.numel()} tokens: {r['prefill_s']:.3f} s; decode {a.new_tokens} tokens: "
          + (f"{r['decode_tokens_per_s']:.1f} tokens/s" if r["decode_tokens_per_s"] else "one token"))
    print(f"text: {text!r}")
    hits = None
    if key is not None:
        hits = sum(str(key) in tok.decode(t.tolist()) for t in r["tokens"])
        print(f"passkey {key}: retrieved in {hits} of {a.batch} sequences")
    if a.check:
        _check(model, sch, ids, r["tokens"][0].tolist())
    if a.csv:
        new = not os.path.exists(a.csv)
        with open(a.csv, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            if new:
                w.writeheader()
            w.writerow({"scheme": str(sch) if sch.name is None else sch.name, "model": a.model, "batch": a.batch,
                        "context": ids.numel(), "new_tokens": a.new_tokens, "kv_budget_gib": a.budget_gib,
                        "capacity_tokens": cap, "prefill_s": r["prefill_s"],
                        "decode_tokens_per_s": r["decode_tokens_per_s"], "bf16_decode_tokens_per_s": None,
                        "passkey_hits": hits, "passkey_trials": a.batch if key is not None else None,
                        "device": a.device, "kernels": a.kernels})
    return 0


def _serve(a, model, tok, sch) -> int:
    """--requests: continuous batching of varied requests over --batch slots; prints throughput and latency."""
    import random

    from ..cache import KVPool
    from ..eval.perplexity import text_tokens
    from .batcher import Batcher
    c, P = model.config, page_size_for(sch)
    text = text_tokens(tok, "pydoc")
    rng = random.Random(0)
    hi_len = min(a.prompt_len, c.max_position_embeddings - a.new_tokens, text.numel() - 1)
    pool = KVPool.from_memory(a.budget_gib, sch, c.n_layers, c.n_kv_heads, c.head_dim, P, max_seqs=a.batch,
                              device=a.device, store=_store(a.kernels))
    b = Batcher(model, pool, slots=a.batch, kernels=a.kernels, chunk=a.chunk, graphs=a.graphs)
    for _ in range(a.requests):
        n, m = rng.randint(max(1, hi_len // 2), hi_len), rng.randint(max(1, a.new_tokens // 2), a.new_tokens)
        off = rng.randint(0, text.numel() - n)
        b.submit(text[off:off + n], m)
    r = b.run()
    reqs = r["requests"]
    lat = sorted(q.done_s for q in reqs)
    print(f"scheme {sch} on {a.model} ({a.device}, {a.kernels} kernels, graphs {r['graphs']}): {a.requests} requests "
          f"over {a.batch} slots, {pool.n_pages} pages of {P}")
    print(f"{sum(q.prompt.numel() for q in reqs)} prompt tokens, {sum(len(q.tokens) for q in reqs)} new tokens; "
          f"prefill {r['prefill_s']:.3f} s; decode {r['steps']} steps, {r['mean_busy_slots']:.1f} busy slots, "
          + (f"{r['decode_tokens_per_s']:.1f} tokens/s" if r["decode_tokens_per_s"] else "no decode step"))
    print(f"latency to the last token: median {lat[len(lat) // 2]:.3f} s, max {lat[-1]:.3f} s; first request's "
          f"text: {tok.decode(reqs[0].tokens)!r}")
    return 0


def _store(kernels: str):
    if kernels == "reference":
        return None
    from ..kernels.store import pool_store
    return pool_store


def _check(model, sch, ids, got: list[int]) -> None:
    """Greedy tokens of the decode-faithful simulation beside the paged run's: first difference and margin."""
    import torch

    from ..eval.faithful import DecodeFaithfulBackend
    be = DecodeFaithfulBackend(sch, model.config.n_layers)
    dev = next(model.parameters()).device
    with torch.no_grad():
        logits = model(ids[None].to(dev), backend=be, last=1)[:, -1]
        sim, margins = [], []
        for _ in range(len(got)):
            top = logits[0].float().topk(2)
            sim.append(int(top.indices[0]))
            margins.append(float(top.values[0] - top.values[1]))
            logits = model(torch.tensor([[got[len(sim) - 1]]], device=dev),
                           backend=be)[:, -1]
    first = next((i for i, (x, y) in enumerate(zip(got, sim)) if x != y), None)
    if first is None:
        print(f"check: all {len(got)} tokens equal the decode-faithful simulation's")
    else:
        print(f"check: first difference at new token {first} (paged {got[first]}, simulation {sim[first]}); the "
              f"simulation's top-2 logit margin there is {margins[first]:.3f} (teacher-forced on the paged tokens)")


if __name__ == "__main__":
    sys.exit(main())
