"""In-register column permutations (`kvlab.kernels.tiles.permute`): the host classification of tile perms and the
two Triton reorderings against torch indexing (interpreter on the CPU, the GPU where there is one)."""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import kvlab
from kvlab.kernels.tiles.layout import tile_config
from kvlab.kernels.tiles.permute import perm_kind, to_natural_order, to_tile_order

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("name,D,want", [("q4_0", 64, (2, 16)), ("q4_0", 256, (2, 16)), ("mxfp4", 128, (2, 16)),
                                         ("q5_1", 128, (2, 16)), ("bf16", 128, (1, 128)), ("kivi4", 64, (1, 64)),
                                         ("nvfp4", 128, (1, 128)), ("int3:g32:asym", 128, (1, 128))])
def test_perm_kind_of_the_tile_orders(name, D, want):
    sch = kvlab.scheme(name)
    for spec in (sch.k, sch.v):
        assert perm_kind(tile_config(spec, D)[1], D) == want


def test_perm_kind_without_structure_is_a_gather():
    perm = list(range(64))
    perm[3], perm[5] = perm[5], perm[3]
    assert perm_kind(perm, 64) == (0, 0)
    four = [g * 32 + m * 8 + b for g in range(2) for b in range(8) for m in range(4)]  # 2-bit GGML-strided planes
    assert perm_kind(four, 64) == (4, 8)


@triton.jit
def _roundtrip(X, T, N, R: tl.constexpr, D: tl.constexpr, M: tl.constexpr, H: tl.constexpr):
    r = tl.arange(0, R)[:, None]
    d = tl.arange(0, D)[None, :]
    t = to_tile_order(tl.load(X + r * D + d), R, D, M, H)
    tl.store(T + r * D + d, t)
    tl.store(N + r * D + d, to_natural_order(t, R, D, M, H))


@pytest.mark.parametrize("M,H,D", [(2, 16, 64), (2, 16, 128), (4, 8, 64), (1, 64, 64)])
def test_tile_order_matches_the_perm(M, H, D):
    perm = [g * M * H + m * H + b for g in range(D // (M * H)) for b in range(H) for m in range(M)]
    x = torch.randn(16, D, device=DEV)
    t, n = torch.empty_like(x), torch.empty_like(x)
    _roundtrip[(1,)](x, t, n, R=16, D=D, M=M, H=H)
    assert torch.equal(t, x[:, perm]) and torch.equal(n, x)
