"""Greedy generation through `PagedBackend`: chunked prefill, then one decode step per new token, timed."""
from __future__ import annotations

import time

import torch
from torch import Tensor

from .backend import PagedBackend


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def generate(model, pool, prompts: Tensor, n_new: int, chunk: int = 2048, kernels: str = "triton") -> dict:
    """Greedy-generate `n_new` tokens after each row of `prompts` [B, T] (one shared length) through `pool`.

    Returns {"tokens": [B, n_new] int64, "prefill_s", "decode_s", "decode_tokens_per_s" (B x steps / time),
    "seq_ids"}. The sequences stay in the pool (free them with pool.free)."""
    if prompts.dim() != 2 or prompts.shape[1] < 1:
        raise ValueError(f"prompts must be [B, T] token ids with T >= 1, got {tuple(prompts.shape)}")
    if n_new < 1 or chunk < 1:
        raise ValueError(f"n_new ({n_new}) and chunk ({chunk}) must be >= 1")
    dev = next(model.parameters()).device
    B, T = prompts.shape
    ids = [pool.add_sequence() for _ in range(B)]
    be = PagedBackend(pool, ids, kernels)
    prompts = prompts.to(dev)
    _sync(dev)
    t0 = time.perf_counter()
    logits = None
    for i in range(0, T, chunk):
        j = min(T, i + chunk)
        logits = model(prompts[:, i:j], positions=torch.arange(i, j, device=dev), backend=be, last=1)
    nxt = logits[:, -1].argmax(-1)
    _sync(dev)
    t1 = time.perf_counter()
    out = [nxt]
    for s in range(n_new - 1):
        logits = model(nxt[:, None], positions=torch.tensor([T + s], device=dev), backend=be)
        nxt = logits[:, -1].argmax(-1)
        out.append(nxt)
    _sync(dev)
    t2 = time.perf_counter()
    steps = n_new - 1
    return {"tokens": torch.stack(out, 1).cpu(), "prefill_s": t1 - t0, "decode_s": t2 - t1,
            "decode_tokens_per_s": B * steps / (t2 - t1) if steps else None, "seq_ids": ids}
