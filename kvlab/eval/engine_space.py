"""The space an engine profile computes attention in (`kvlab.spec.engines`), for the decode-faithful
evaluation: keys (and queries) in the engine's channel order and Hadamard rotation, values in theirs,
queries rounded as the engine rounds them before Q.K, and the output rotated back.

Scores are invariant under the orthogonal maps (a permutation, a Hadamard rotation applied to both q and
k), so what changes is only what the engine changes: which channels share a quantization block, the
rotated values the blocks see, and the query's own rounding.
"""
from __future__ import annotations

import functools

import torch
from torch import Tensor

from ..quant import fake_quantize
from ..quant.rotation import hadamard_blocks
from ..spec import parse_spec


def gguf_order(head_dim: int) -> list[int]:
    """HF channel held by each GGUF-order channel of a head: 2j -> j, 2j + 1 -> j + D/2 (the converter's
    q/k row permutation for llama.cpp's interleaved RoPE)."""
    return [c // 2 + (c % 2) * (head_dim // 2) for c in range(head_dim)]


class EngineSpace:
    """Maps one model's q [B, Hq, T, D], k, v [B, Hk, S, D] into a profile's attention space and back."""

    def __init__(self, profile, head_dim: int, qk_permuted: bool, device) -> None:
        kb, vb = profile.rotation_blocks(head_dim)
        self.perm = (torch.tensor(gguf_order(head_dim), device=device)
                     if profile.gguf_k_order and qk_permuted else None)
        self.hk = hadamard_blocks(head_dim, kb, device) if kb else None
        self.hv = hadamard_blocks(head_dim, vb, device) if vb else None
        self.q_spec = parse_spec(profile.q_spec) if profile.q_spec else None

    def keys(self, x: Tensor) -> Tensor:
        """Keys (or queries) in the engine's channel order and K rotation."""
        if self.perm is not None:
            x = x[..., self.perm]
        return x.float() @ self.hk if self.hk is not None else x

    def queries(self, q: Tensor) -> Tensor:
        """Queries as the engine multiplies them with its keys: mapped as keys, then rounded (e.g. q8_0)."""
        q = self.keys(q)
        return fake_quantize(q.float().contiguous(), self.q_spec) if self.q_spec is not None else q

    def values(self, v: Tensor) -> Tensor:
        return v.float() @ self.hv if self.hv is not None else v

    def output(self, o: Tensor) -> Tensor:
        """The attention output back in the model's space (undoes the V rotation)."""
        return o.float() @ self.hv.T if self.hv is not None else o


@functools.lru_cache(maxsize=16)
def engine_space(profile, head_dim: int, qk_permuted: bool, device: str) -> EngineSpace:
    return EngineSpace(profile, head_dim, qk_permuted, device)
