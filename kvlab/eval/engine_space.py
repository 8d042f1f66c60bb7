"""The space an engine profile computes attention in (`kvlab.spec.engines`), for the decode-faithful
evaluation: keys (and queries) in the engine's channel order and rotation, values in theirs, queries rounded
as the engine rounds them before Q.K, keys and values stored by the engine's own codec where it has one,
and the output rotated back.

Scores are invariant under the orthogonal maps (a permutation, a rotation applied to both q and k), so what
changes is only what the engine changes: which channels share a quantization block, the rotated values the
blocks see, the query's own rounding and the engine's quantizer.
"""
from __future__ import annotations

import functools

import torch
from torch import Tensor

from ..quant import engine_codecs
from ..quant.rotation import hadamard_blocks

RHT_SEED = 0x9E3779B9  # vLLM's int4_per_token_head sign seed (`_get_rht_signs`, round 0)


def gguf_order(head_dim: int) -> list[int]:
    """HF channel held by each GGUF-order channel of a head: 2j -> j, 2j + 1 -> j + D/2 (the converter's
    q/k row permutation for llama.cpp's interleaved RoPE)."""
    return [c // 2 + (c % 2) * (head_dim // 2) for c in range(head_dim)]


@functools.lru_cache(maxsize=8)
def rht_signs(block: int) -> tuple[float, ...]:
    """vLLM's deterministic +-1 signs of its randomized Hadamard transform over `block` elements: a CPU
    generator seeded with RHT_SEED, Bernoulli(0.5) draws mapped to 2b - 1."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(RHT_SEED)
    return tuple((2.0 * torch.bernoulli(torch.full((block,), 0.5), generator=gen) - 1.0).tolist())


def rotation_matrix(kind: str | None, block: int, head_dim: int, device) -> Tensor | None:
    """[D, D] orthonormal matrix R with rotated rows x @ R, or None (no rotation)."""
    if not block:
        return None
    H = hadamard_blocks(head_dim, block, device)
    if kind == "rht":  # H (d * x) per block: signs first
        d = torch.tensor(rht_signs(block), device=device).repeat(head_dim // block)
        return d[:, None] * H
    return H


class EngineSpace:
    """Maps one model's q [B, Hq, T, D], k, v [B, Hk, S, D] into a profile's attention space and back."""

    def __init__(self, profile, head_dim: int, qk_permuted: bool, device) -> None:
        kb, vb = profile.rotation_blocks(head_dim)
        self.profile = profile
        self.perm = (torch.tensor(gguf_order(head_dim), device=device)
                     if profile.gguf_k_order and qk_permuted else None)
        self.hk = rotation_matrix(profile.k_rot, kb, head_dim, device)
        self.hv = rotation_matrix(profile.v_rot, vb, head_dim, device)
        self.round_rotated = "rht" in (profile.k_rot, profile.v_rot)  # vLLM casts rotated rows back to bf16

    def _rot(self, x: Tensor, h: Tensor | None) -> Tensor:
        if h is None:
            return x
        y = x.float() @ h
        return y.to(torch.bfloat16).float() if self.round_rotated else y

    def keys(self, x: Tensor) -> Tensor:
        """Keys (or queries) in the engine's channel order and K rotation."""
        if self.perm is not None:
            x = x[..., self.perm]
        return self._rot(x, self.hk)

    def queries(self, q: Tensor) -> Tensor:
        """Queries as the engine multiplies them with its keys: mapped as keys, then rounded (e.g. q8_0)."""
        q = self.keys(q)
        return engine_codecs.apply(self.profile.q_round, q).to(q.dtype) if self.profile.q_round else q

    def values(self, v: Tensor) -> Tensor:
        return self._rot(v, self.hv)

    def output(self, o: Tensor) -> Tensor:
        """The attention output back in the model's space (undoes the V rotation)."""
        return o.float() @ self.hv.T if self.hv is not None else o

    def codec(self, side: str):
        """The engine's quantizer for side "k" / "v" as x -> values, or None (kvlab's spec is exact)."""
        name = self.profile.k_codec if side == "k" else self.profile.v_codec
        return functools.partial(engine_codecs.apply, name) if name else None


@functools.lru_cache(maxsize=16)
def engine_space(profile, head_dim: int, qk_permuted: bool, device: str) -> EngineSpace:
    return EngineSpace(profile, head_dim, qk_permuted, device)
