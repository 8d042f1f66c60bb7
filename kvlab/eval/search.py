"""Scheme search under a bit budget: measured per-layer sensitivities, then the cheapest allocation.

    res = search(model, tokenizer, ["lm2:rot=had", "lm3:rot=had", "lm4:rot=had"], budget=3.5)
    res["scheme"]        # one DSL line: the most used candidate as base, the other layers as L<i>= overrides

1. Sensitivity (on calibration text): for every layer l and candidate c, KL(full || model with layer l's cache
   in c and every other layer in full precision), through the decode-faithful backend (`score_segments`).
2. Allocation: one candidate per layer minimising the summed sensitivities (KL adds up across layers to first
   order) subject to the mean effective bits per element over layers <= budget: an exact multiple-choice
   knapsack by dynamic programming over bit units of 1/64 bit.
3. The chosen scheme is then evaluated like any other (`evaluate_scheme`), on held-out text.

A candidate is one spec for a layer's K and V, or a pair `KSPEC|VSPEC` (the scheme DSL's `L<i>=KSPEC|VSPEC`):
channel-axis keys with token-axis values, more bits for keys than values, and so on.
"""
from __future__ import annotations

import math

import torch

from ..spec import KVScheme, as_scheme, as_spec
from .perplexity import bos_prefix, score_segments, segments, text_tokens

UNIT = 64  # bit units per bit in the allocation


def pair(candidate: str) -> tuple:
    """(K spec, V spec) of a candidate: `SPEC` (both) or `KSPEC|VSPEC`."""
    ks, bar, vs = candidate.partition("|")
    return as_spec(ks), as_spec(vs if bar else ks)


def _spec_bits(candidate: str, head_dim: int, context: int | None = None, sink: int = 0) -> float:
    """A layer's bits per element in `candidate`: nominal, or with `context` effective (sinks and a channel-axis
    key's unfinished group kept full precision, amortized over `context` tokens, as `evaluate_scheme` counts)."""
    ks, vs = pair(candidate)
    return KVScheme(k=ks, v=vs, sink=sink).bits_per_element(head_dim, context=context)


@torch.no_grad()
def layer_sensitivity(model, segs: list[torch.Tensor], candidates: list[str], progress=None,
                      sink: int = 0) -> list[list[float]]:
    """sens[l][c]: mean KL over `segs` with layer l's K and V in candidate c, every other layer bf16 (the first
    `sink` tokens of every layer full precision, as the searched scheme will keep them)."""
    n = model.config.n_layers
    specs = [pair(c) for c in candidates]
    fp = as_scheme("bf16")
    out = []
    for layer in range(n):
        row = []
        for spec in specs:
            sch = KVScheme(k=fp.k, v=fp.v, sink=sink, overrides=((layer, *spec),))
            rows = score_segments(model, segs, sch)
            row.append(sum(r["kl"] for r in rows) / len(rows))
            if progress is not None:
                progress()
        out.append(row)
    return out


def allocate(sens: list[list[float]], bits: list[float], budget: float) -> list[int]:
    """Candidate index per layer minimising sum(sens[l][c_l]) with mean(bits[c_l]) <= budget (exact DP over bit
    units of 1/UNIT). ValueError when even the cheapest candidate everywhere exceeds the budget."""
    n, units = len(sens), [round(b * UNIT) for b in bits]
    cap = math.floor(budget * UNIT * n + 1e-9)
    if min(units) * n > cap:
        raise ValueError(f"budget {budget} bits/element is below the cheapest candidate ({min(bits):.3f})")
    INF = float("inf")
    best = {0: (0.0, [])}  # used units -> (cost, choices)
    for layer in range(n):
        nxt: dict = {}
        for used, (cost, ch) in best.items():
            for c, u in enumerate(units):
                t = used + u
                if t > cap:
                    continue
                v = cost + sens[layer][c]
                if v < nxt.get(t, (INF,))[0]:
                    nxt[t] = (v, ch + [c])
        best = nxt
    return min(best.values(), key=lambda r: r[0])[1]


def scheme_of(choice: list[int], candidates: list[str], sink: int = 0) -> KVScheme:
    """The DSL scheme of a per-layer choice: the most used candidate as base, the others as `L<i>=` overrides
    (and `sink` full-precision first tokens)."""
    base = max(set(choice), key=lambda c: (choice.count(c), -c))
    ks, vs = pair(candidates[base])
    over = tuple((layer, *pair(candidates[c])) for layer, c in enumerate(choice) if c != base)
    return KVScheme(k=ks, v=vs, sink=sink, overrides=over)


def choose(res: dict, budget: float, head_dim: int) -> dict:
    """`search`'s result re-allocated under another budget from the same sensitivities (and bit accounting)."""
    bits = [_spec_bits(c, head_dim, res.get("context"), res.get("sink", 0)) for c in res["candidates"]]
    choice = allocate(res["sens"], bits, budget)
    return {**res, "scheme": str(scheme_of(choice, res["candidates"], res.get("sink", 0))),
            "choice": [res["candidates"][c] for c in choice],
            "predicted_kl": sum(res["sens"][layer][c] for layer, c in enumerate(choice)),
            "bits_per_element": sum(bits[c] for c in choice) / len(choice)}


@torch.no_grad()
def search(model, tokenizer, candidates: list[str], budget: float, *, calib_text: str = "license",
           calib_tokens: int = 1024, calib_segments: int = 1, progress=None, sink: int = 0,
           context: int | None = None, sens: list | None = None) -> dict:
    """Sensitivities on `calib_text`, then the allocation under `budget` bits per element (mean over layers:
    nominal, or effective at `context` tokens; `sink` first tokens kept full precision in every layer; `sens`: a
    sensitivity table measured before, reused). Returns {"scheme": text, "choice": [candidate per layer],
    "predicted_kl": summed sensitivities, "bits_per_element", "sens": [[KL]], "candidates", "calib_text",
    "calib_tokens", "calib_segments", "sink", "context"} (`choose` re-allocates it under another budget)."""
    if not candidates:
        raise ValueError("give at least one candidate spec")
    D = model.config.head_dim
    for c in candidates:
        for s in pair(c):
            s.check_head_dim(D)
    if sens is None:
        segs = segments(text_tokens(tokenizer, calib_text), calib_tokens, calib_segments, prefix=bos_prefix(tokenizer))
        sens = layer_sensitivity(model, segs, candidates, progress, sink)
    elif len(sens) != model.config.n_layers or any(len(r) != len(candidates) for r in sens):
        raise ValueError(f"the sensitivity table is not {model.config.n_layers} layers x {len(candidates)} candidates")
    base = {"sens": sens, "candidates": candidates, "calib_text": calib_text, "calib_tokens": calib_tokens,
            "calib_segments": calib_segments, "sink": sink, "context": context}
    return choose(base, budget, D)
