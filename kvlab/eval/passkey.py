"""Passkey retrieval through a quantized cache: a number hidden at a depth of filler text.

The prompt (after Mohtashami & Jaggi 2023): filler sentences, "The pass key is NNNNN. Remember
it. NNNNN is the pass key." at a fraction `depth` of the context, more filler, then "What is the
pass key? The pass key is". A hit is the greedy continuation containing the number. Generation is verified
in one parallel pass against the full-precision continuation (see greedy.py).
"""
from __future__ import annotations

import random

import torch

from ..spec import as_scheme
from .faithful import DecodeFaithfulBackend, calibrate
from .greedy import greedy_generate_batch

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


def _ids(tokenizer, text: str) -> list[int]:
    enc = tokenizer.encode(text, add_special_tokens=False)
    return list(getattr(enc, "ids", enc))


def passkey_prompt(tokenizer, length: int, depth: float, key: int) -> torch.Tensor:
    """Token ids [~length] with the key sentence at fraction `depth` (0 = start, 1 = end)."""
    head = _ids(tokenizer, "There is important info hidden inside a lot of irrelevant text. Find it and memorize it. ")
    needle = _ids(tokenizer, f"The pass key is {key}. Remember it. {key} is the pass key. ")
    tail = _ids(tokenizer, "What is the pass key? The pass key is")
    fill = _ids(tokenizer, FILLER)
    n_fill = max(0, length - len(head) - len(needle) - len(tail))
    filler = (fill * (n_fill // len(fill) + 1))[:n_fill]
    cut = int(round(depth * n_fill))
    return torch.tensor(head + filler[:cut] + needle + filler[cut:] + tail, dtype=torch.int64)


@torch.no_grad()
def passkey(model, tokenizer, scheme, lengths=(512, 1024), depths=(0.1, 0.5, 0.9), seed: int = 0,
            n_new: int = 8) -> dict:
    """Passkey hits of `scheme` over lengths x depths. Returns {"hits", "trials", "detail": [...]}."""
    sch = as_scheme(scheme)
    c = model.config
    if max(lengths) + n_new > c.max_position_embeddings:
        raise ValueError(f"passkey length {max(lengths)} exceeds the model's context {c.max_position_embeddings}")
    rng = random.Random(seed)
    dev = next(model.parameters()).device
    from .perplexity import text_tokens
    calib = calibrate(model, text_tokens(tokenizer, "license")[:512][None].to(dev), sch)
    detail = []
    for length in lengths:
        keys = [rng.randint(10000, 99999) for _ in depths]
        prompts = [passkey_prompt(tokenizer, length, depth, key) for depth, key in zip(depths, keys)]
        by_len: dict[int, list[int]] = {}
        for i, p in enumerate(prompts):
            by_len.setdefault(p.numel(), []).append(i)
        gens: dict[int, list[int]] = {}
        for idx in by_len.values():  # one batch per prompt length (the depths of one length, usually)
            rows = greedy_generate_batch(model, [prompts[i] for i in idx],
                                         lambda: DecodeFaithfulBackend(sch, c.n_layers, calib), n_new)
            gens.update(zip(idx, rows))
        for i, (depth, key) in enumerate(zip(depths, keys)):
            text = tokenizer.decode(gens[i])
            detail.append({"length": length, "depth": depth, "key": key, "hit": str(key) in text.replace(" ", "")})
    return {"hits": sum(d["hit"] for d in detail), "trials": len(detail), "detail": detail}
