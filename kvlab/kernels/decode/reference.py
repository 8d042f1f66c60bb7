"""Torch float32 reference of paged decode attention (CPU or GPU; never imports Triton).

Gathers each sequence's pages in block-table order, dequantizes them through the oracle
(`kvlab.dequantize`) and attends over [quantized tokens, full-precision tokens].
"""
from __future__ import annotations

import torch

from ..paged import PagedKV, attend, sequence_kv


def run(q: torch.Tensor, kv: PagedKV, sm_scale: float) -> torch.Tensor:
    """q [B, Hq, D] -> [B, Hq, D] in q.dtype: each sequence's query over all its tokens."""
    B, Hq, D = q.shape
    out = torch.empty(B, Hq, D, dtype=torch.float32, device=q.device)
    for b in range(B):
        k, v = sequence_kv(kv, b, D)
        out[b] = attend(q[b:b + 1], k, v, sm_scale)[0]
    return out.to(q.dtype)
