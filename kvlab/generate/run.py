"""Greedy generation of one batch of equal-length prompts: chunked prefill, then decode steps (`Batcher`)."""
from __future__ import annotations

import torch
from torch import Tensor

from .batcher import Batcher


@torch.no_grad()
def generate(model, pool, prompts: Tensor, n_new: int, chunk: int = 2048, kernels: str = "triton",
             graphs: bool | None = None, max_position: int | None = None) -> dict:
    """Greedy-generate `n_new` tokens after each row of `prompts` [B, T] (one shared length) through `pool`.

    Decode steps run through `kvlab.cache.DecodeStep` (one plan per step for every layer), captured in a CUDA
    graph on the GPU (graphs=None: on CUDA). Returns {"tokens": [B, n_new] int64, "prefill_s", "decode_s",
    "decode_tokens_per_s" (B x steps / time), "seq_ids", "graphs"}. The sequences stay in the pool (free them
    with pool.free); the pool's fp rows 0..B-1 must be free. max_position: the longest position allowed
    (default: the model's trained context; larger values extrapolate RoPE, for timing long prompts)."""
    if prompts.dim() != 2 or prompts.shape[1] < 1:
        raise ValueError(f"prompts must be [B, T] token ids with T >= 1, got {tuple(prompts.shape)}")
    if n_new < 1 or chunk < 1:
        raise ValueError(f"n_new ({n_new}) and chunk ({chunk}) must be >= 1")
    B, T = prompts.shape
    if B > pool.max_seqs:
        raise ValueError(f"{B} prompts but the pool holds max_seqs={pool.max_seqs} sequences")
    b = Batcher(model, pool, slots=B, max_tokens=min(max_position or model.config.max_position_embeddings, max(T + n_new, 1)),
                kernels=kernels, chunk=chunk, graphs=graphs, keep=True)
    for row in prompts.cpu():
        b.submit(row, n_new)
    r = b.run()
    reqs = r["requests"]
    return {"tokens": torch.tensor([q.tokens for q in reqs], dtype=torch.long), "prefill_s": r["prefill_s"],
            "decode_s": r["decode_s"], "decode_tokens_per_s": r["decode_tokens_per_s"],
            "seq_ids": [q.seq for q in reqs], "graphs": r["graphs"]}
