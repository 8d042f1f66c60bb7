"""In-register column permutations between a head_dim's natural order and a dequantized tile's column order.

A tile's columns follow the packed bytes (`tiles.layout.tile_config`'s perm): identity for most specs, and for
GGML-strided planes element m of byte b of a G-element group sits H = G / M apart (q4_0: M = 2, H = 16, tile column
2b + m holds channel b + 16 m). Kernels that move whole rows between the two orders (the extend dense path's query
stacking and state merge) load and store contiguous rows and permute in registers (a reshape and a transpose the
compiler lowers to a register shuffle or a shared-memory round trip) instead of gathering 2-byte columns through a
permutation tensor, which kept those loads scalar. `perm_kind` classifies a perm on the host; a perm of neither form
(M = 0) keeps the gather.
"""
from __future__ import annotations

import triton
import triton.language as tl

PARTS = (2, 4, 8)  # elements a byte's group is split into (8 / bits of the strided plane)


def perm_kind(perm, D: int) -> tuple[int, int]:
    """(M, H) of a tile column permutation `perm` (perm[col] = channel) over head_dim D: (1, D) for the identity;
    (M, H) with M in PARTS where perm[g M H + M b + m] = g M H + m H + b for every group g, byte b < H, part m < M;
    (0, 0) otherwise (the caller gathers through the perm tensor)."""
    perm = [int(p) for p in perm]
    if perm == list(range(D)):
        return 1, D
    for M in PARTS:
        for H in (4, 8, 16, 32, 64, 128):
            if D % (M * H):
                continue
            want = [g * M * H + m * H + b for g in range(D // (M * H)) for b in range(H) for m in range(M)]
            if perm == want:
                return M, H
    return 0, 0


@triton.jit
def to_tile_order(x, R: tl.constexpr, D: tl.constexpr, M: tl.constexpr, H: tl.constexpr):
    """x [R, D] in natural column order -> the tile's column order ((M, H) from `perm_kind`, M >= 1)."""
    if M > 1:
        NG: tl.constexpr = D // (M * H)
        x = tl.reshape(tl.permute(tl.reshape(x, [R, NG, M, H]), [0, 1, 3, 2]), [R, D])
    return x


@triton.jit
def to_natural_order(x, R: tl.constexpr, D: tl.constexpr, M: tl.constexpr, H: tl.constexpr):
    """The inverse of `to_tile_order`: x [R, D] in the tile's column order -> natural order."""
    if M > 1:
        NG: tl.constexpr = D // (M * H)
        x = tl.reshape(tl.permute(tl.reshape(x, [R, NG, H, M]), [0, 1, 3, 2]), [R, D])
    return x
