"""The in-register Hadamard transform of rotated specs against the oracle's `rotate`, bit for bit: the constant-
geometry stages as the oracle writes them (`fwht_rows`) and the same stages in place (`fwht_rows_in_place`, a pair
exchange by xor instead of split / join / transpose), on random rows spread over 60 binades and on signed zeros,
subnormals, +-3e38 (overflowing sums), inf and NaN. Runs under the interpreter (CPU CI) and on a GPU."""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from kvlab.kernels.tiles.rotate import fwht_rows_in_place, fwht_rows
from kvlab.quant.rotation import norm_constant, rotate

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _both(x_ptr, o_ptr, p_ptr, BR: tl.constexpr, D: tl.constexpr, LOG: tl.constexpr, C: tl.constexpr):
    r = tl.arange(0, BR)[:, None]
    c = tl.arange(0, D)[None, :]
    x = tl.load(x_ptr + r * D + c)
    tl.store(o_ptr + r * D + c, fwht_rows(x, BR, D, LOG, C))
    tl.store(p_ptr + r * D + c, fwht_rows_in_place(x, BR, D, LOG, C))


def _rows(D: int, BR: int = 8) -> torch.Tensor:
    g = torch.Generator().manual_seed(D)
    x = torch.randn(BR, D, generator=g) * torch.exp2(torch.randint(-30, 30, (BR, D), generator=g).float())
    x[0, :6] = torch.tensor([0.0, -0.0, 1e-45, -3e38, 3e38, -1e-40])
    x[1, 3] = float("inf")
    x[2, 7] = float("nan")
    x[3] = -0.0
    x[4] = torch.randn(D, generator=g).to(torch.bfloat16).float()
    x[5, ::2] = 1.0
    x[5, 1::2] = -1.0
    return x


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit patterns, any NaN equal to any NaN (the GPU's NaN is canonical, torch's CPU keeps payloads)."""
    nan = torch.isnan(a)
    return bool(torch.equal(nan, torch.isnan(b)) and torch.equal(a.view(torch.int32)[~nan], b.view(torch.int32)[~nan]))


@pytest.mark.parametrize("D", [16, 64, 128, 256])
def test_in_register_transforms_are_the_oracles(D):
    x = _rows(D)
    want = rotate(x)
    xd = x.to(DEV)
    got, in_place = torch.empty_like(xd), torch.empty_like(xd)
    _both[(1,)](xd, got, in_place, BR=x.shape[0], D=D, LOG=D.bit_length() - 1, C=norm_constant(D))
    assert _same_bits(got.cpu(), want), "fwht_rows"
    assert _same_bits(in_place.cpu(), want), "in place"
