"""Torch float32 reference of extend (chunked prefill) over a quantized paged prefix. No Triton."""
from __future__ import annotations

import torch

from ..paged import PagedKV, attend, sequence_kv


def run(q, k_new, v_new, qo_indptr, kv: PagedKV, sm_scale: float) -> torch.Tensor:
    """q [C, Hq, D], k_new/v_new [C, Hk, D] -> [C, Hq, D] (q.dtype): each chunk query attends the whole
    prefix (dequantized pages + full-precision buffer) and the chunk's keys up to itself."""
    Ctot, Hq, D = q.shape
    out = torch.zeros(Ctot, Hq, D, dtype=torch.float32, device=q.device)
    for b in range(qo_indptr.shape[0] - 1):
        a, e = int(qo_indptr[b]), int(qo_indptr[b + 1])
        if e == a:
            continue
        k, v = sequence_kv(kv, b, D)
        Lp, C = k.shape[1], e - a
        k = torch.cat([k, k_new[a:e].float().transpose(0, 1)], 1)  # [Hk, Lp + C, D]
        v = torch.cat([v, v_new[a:e].float().transpose(0, 1)], 1)
        i = torch.arange(C, device=q.device)[:, None]
        j = torch.arange(Lp + C, device=q.device)[None, :]
        mask = (j < Lp) | (j - Lp <= i)  # [C, Lp + C]
        out[a:e] = attend(q[a:e], k, v, sm_scale, mask[None])
    return out.to(q.dtype)
