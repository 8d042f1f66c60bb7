"""The GPU-only exact helpers of `kvlab.kernels.tiles.exact` against torch on the values where rounding is decided:
ties, their neighbours one ulp away, NaN, +-inf and the int32 range's edges. They compile to PTX the interpreter does
not run (the store takes `rint_even` there, which the CPU tests cover), so these run on an NVIDIA GPU only."""
from __future__ import annotations

import pytest
import torch

from kvlab.kernels.env import interpreting

pytestmark = pytest.mark.skipif(interpreting() or not torch.cuda.is_available(),
                                reason="inline PTX: an NVIDIA GPU only")


def _tricky() -> torch.Tensor:
    halves = torch.arange(-40, 41, dtype=torch.float32) + 0.5  # ties both ways around even and odd integers
    near = torch.cat([torch.nextafter(halves, halves + 1), torch.nextafter(halves, halves - 1)])
    big = torch.tensor([2.0 ** 23 - 0.5, 2.0 ** 23 + 1, 2.0 ** 24 + 2, 2.0 ** 31 - 128, 2.0 ** 31, 3e9, -2.0 ** 31,
                        -3e9, 1e38, -1e38, float("inf"), float("-inf"), float("nan"), -0.0, 0.0, 1e-45, -0.49999997])
    return torch.cat([halves, near, big]).cuda()


def test_rint_i32_hw_is_round_half_even_with_nan_zero_and_saturation():
    import triton
    import triton.language as tl

    from kvlab.kernels.tiles.exact import rint_i32_hw

    @triton.jit
    def k(x_ptr, o_ptr, N: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(o_ptr + i, rint_i32_hw(tl.load(x_ptr + i)))

    x = _tricky()
    n = triton.next_power_of_2(x.numel())
    xp = torch.cat([x, torch.zeros(n - x.numel(), device="cuda")])
    out = torch.empty(n, dtype=torch.int32, device="cuda")
    k[(1,)](xp, out, N=n)
    want = torch.nan_to_num(torch.round(x.double()), nan=0.0).clamp(-2.0 ** 31, 2.0 ** 31 - 1).to(torch.int64)
    assert torch.equal(out[:x.numel()].to(torch.int64).cpu(), want.cpu())
