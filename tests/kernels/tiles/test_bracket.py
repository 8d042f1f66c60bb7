"""The e2m1 codes by arithmetic (`kvlab.kernels.tiles.bracket.e2m1_pow2_codes`, `e2m1_bracket_codes`) against the
oracle's rule (the nearest of s * level by float32 errors, the first index on ties, NaN 0) over the whole range the
store's fast path gives them (|x| up to 12 s, `store.triton._e2m1_odd`): every level and midpoint and 1..3 ulps either
side, the last bracket and past it, random values; power-of-two scales for the first, odd ones for the second. On the
interpreter in CPU CI and compiled on a GPU, launched as the store launches (`enable_fp_fusion=False`: a fused
s * level - a skips the product's rounding and flips near-ties, as the H100 showed at s = 3e-5)."""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from kvlab.kernels.env import interpreting
from kvlab.kernels.tiles.bracket import e2m1_bracket_codes, e2m1_pow2_codes

DEV = "cuda" if torch.cuda.is_available() and not interpreting() else "cpu"
LEVELS = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


@triton.jit
def _codes_kernel(a_ptr, s_ptr, o_ptr, N: tl.constexpr, POW2: tl.constexpr):
    i = tl.arange(0, N)
    a = tl.load(a_ptr + i)[None, :]  # [1, N]
    s = tl.load(s_ptr + i * 0)[None, :]  # one scale, as a group's [.., 1]
    s = tl.max(s, axis=1, keep_dims=True)
    u = e2m1_pow2_codes(a, s) if POW2 else e2m1_bracket_codes(a, s)
    tl.store(o_ptr + i[None, :], u)


def _oracle(a: torch.Tensor, s: float) -> torch.Tensor:
    err = ((torch.tensor(s, dtype=torch.float32) * LEVELS)[None, :] - a[:, None]).abs()  # float32, as the store's oracle
    err = torch.where(err.isnan(), torch.tensor(float("inf")), err)  # (NaN a: every error NaN -> index 0)
    return err.argmin(dim=1).to(torch.int32)  # first index on ties


def _values(s: float, g: torch.Generator) -> torch.Tensor:
    mids = (LEVELS[1:] + LEVELS[:-1]) / 2
    t = torch.cat([LEVELS, mids, torch.tensor([6.5, 7.0, 7.5, 9.0, 11.99, 12.0])])
    a = (t * s).float()
    pts, up, dn = [a], a, a
    for _ in range(3):
        up, dn = torch.nextafter(up, up + 1), torch.nextafter(dn, dn - 1)
        pts += [up, dn]
    pts.append(torch.rand(512, generator=g) * 12 * s)
    a = torch.cat(pts).clamp(min=0.0)
    return torch.cat([a, torch.tensor([float("nan")])])


@pytest.mark.parametrize("pow2", [True, False], ids=["pow2", "bracket"])
def test_e2m1_arithmetic_codes_equal_the_oracle(pow2):
    g = torch.Generator().manual_seed(7)
    if pow2:
        scales = [2.0 ** k for k in (-90, -14, -3, 0, 1, 5, 20, 90)]
    else:  # odd scales: e4m3-like, f16-like, anything
        scales = [0.8125, 1.0 / 3.0, 448.0 / 6.0, 3.0e-5, 1.7e4, 2.0 ** -7 * 1.125] + torch.rand(6, generator=g).tolist()
    for s in scales:
        a = _values(s, g)
        n = triton.next_power_of_2(a.numel())
        ap = torch.cat([a, torch.zeros(n - a.numel())]).to(DEV)
        out = torch.empty(n, dtype=torch.int32, device=DEV)
        _codes_kernel[(1,)](ap, torch.tensor([s], dtype=torch.float32, device=DEV), out, N=n, POW2=pow2,
                            enable_fp_fusion=False)  # (as the store launches: s * level rounds before the subtraction)
        got, want = out[:a.numel()].cpu(), _oracle(a, s)
        bad = (got != want).nonzero().flatten()
        assert bad.numel() == 0, (s, a[bad[:5]].tolist(), got[bad[:5]].tolist(), want[bad[:5]].tolist())
