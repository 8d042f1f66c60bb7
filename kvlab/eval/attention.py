"""Attention delta on a real model's captured Q/K/V, split into the part due to K and to V error.

For each layer: O = attention with the full-precision cache; O_k with only K quantized, O_v with
only V quantized, O_kv with both (all decode-faithful). Reported: rel-L2 of each against O.
"""
from __future__ import annotations

import statistics

import torch

from ..spec import as_scheme
from ..cache.window import FpPolicy
from .faithful import faithful_attention, head_histories, quantized_history
from .metrics import rel_l2


@torch.no_grad()
def capture_qkv(model, tokens: torch.Tensor) -> dict:
    """Captured float32 q (post-RoPE), k_pre, k, v per layer for tokens [T] (see LlamaModel.capture)."""
    dev = next(model.parameters()).device
    return model.capture(tokens[None].to(dev))


@torch.no_grad()
def attention_delta(model, captured: dict, scheme, calib: dict | None = None) -> dict:
    """Per-layer rel-L2 attention-output error of `scheme` on captured Q/K/V.

    Returns {"layers": [{layer, k, v, kv}], "k", "v", "kv"} (the last three: means over layers)."""
    sch = as_scheme(scheme)
    n = model.config.n_layers
    pos = captured["positions"]
    policy = FpPolicy.of(sch, n)
    rows = []
    for i in range(n):
        q, k_pre, k, v = (captured[name][i] for name in ("q", "k_pre", "k", "v"))
        ks, vs = sch.for_layer(i, n)
        cal = (calib or {}).get(i, {})
        groups = sch.head_groups(i, n, k.shape[1])
        if len(groups) > 1:  # per-head specs: each group of KV heads quantized as its pair
            kq, vq, ks, vs = head_histories(k, v, groups, sch)
        else:
            kq = quantized_history(k_pre if ks.pre_rope else k, ks, sch, cal.get("k"))
            if ks.pre_rope:
                kq = model.apply_rope(kq, pos)
            vq = quantized_history(v, vs, sch, cal.get("v"))
        ref = faithful_attention(q, k, v, k, v, pos, pos, ks, vs, policy)
        row = {"layer": i}
        for name, kk, vv in (("k", kq, v), ("v", k, vq), ("kv", kq, vq)):
            row[name] = rel_l2(ref, faithful_attention(q, k, v, kk, vv, pos, pos, ks, vs, policy))
        rows.append(row)
    return {"layers": rows, **{m: statistics.fmean(r[m] for r in rows) for m in ("k", "v", "kv")}}
