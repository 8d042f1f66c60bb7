"""Helpers of the key-transform tests (smoothing, permutation): a pool's decode / extend arguments and exact
attention in float64 to hold them against."""
from __future__ import annotations

import torch


def ops_args(pool, sid):
    """(positional, keyword) arguments of `decode` / `extend` after q for layer 0 of one sequence of `pool`."""
    lc, bt, fp = pool.layer_cache(0), pool.block_table([sid]), pool.fp_buffer(0, [sid])
    return ((lc.k_pages, lc.v_pages, bt.kv_indptr, bt.kv_indices, bt.kv_last_page_len, lc.k_spec, lc.v_spec,
             pool.page_size), dict(k_fp=fp.k, v_fp=fp.v, fp_len=fp.length))


def attend(q, k, v):
    """softmax(q k^T / sqrt(D)) v in float64 with GQA: q [Tq, Hq, D], k, v [Hk, S, D], causal over the last Tq."""
    Tq, Hq, D = q.shape
    Hk, S = k.shape[0], k.shape[1]
    sc = (q.double().transpose(0, 1).reshape(Hk, -1, D) @ k.double().transpose(1, 2)).reshape(Hk, Hq // Hk, Tq, S)
    mask = torch.arange(S, device=q.device)[None] <= (S - Tq + torch.arange(Tq, device=q.device))[:, None]
    sc = sc.masked_fill(~mask, float("-inf")) / D ** 0.5
    return (torch.softmax(sc, -1) @ v.double()[:, None]).reshape(Hq, Tq, D).transpose(0, 1)
