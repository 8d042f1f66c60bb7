"""Engine codecs (kvlab.quant.engine_codecs): each one's defining arithmetic, checked on values where the
engine's result is known by hand."""
from __future__ import annotations

import math

import pytest
import torch

import kvlab
from kvlab.quant import engine_codecs as ec


def _x(seed=0, shape=(4, 3, 64), scale=2.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("name", sorted(ec.CODECS))
def test_codecs_are_per_row_and_keep_shape(name):
    """A row's values never depend on other rows (decode-faithful: a token is quantized alone)."""
    x = _x()
    y = ec.apply(name, x)
    assert y.shape == x.shape and y.dtype == torch.float32 and torch.isfinite(y).all()
    # (matmul-based codecs may round the lone row's rotation differently in the last bit, which can move a
    # value across a code boundary: allow that for a few elements, never a different row's influence)
    alone = ec.apply(name, x[1:2, 2:3])
    assert ((alone - y[1:2, 2:3]).abs() > 1e-4 * x.abs().max()).float().mean() < 0.05
    assert (y - x).abs().mean() / x.abs().mean() < 0.25  # 3-bit codes are the coarsest here


def test_vllm_int4_zero_point_lives_in_the_scale_mantissa():
    x = torch.tensor([[-1.0, 0.0, 0.5, 2.0] * 16])
    y = ec.vllm_int4_zp(x)
    scale = (3.0 / 15.0)
    masked = torch.tensor([scale]).view(torch.int32).__and__(-16).view(torch.float32).item()
    zp = 5  # round_half_away(1.0 / 0.2)
    codes = torch.round(y / masked + zp)
    assert torch.allclose(codes, torch.round(codes)) and codes.min() >= 0 and codes.max() <= 15
    assert torch.allclose(y, (codes - zp) * masked)
    assert masked != scale and abs(masked - scale) / scale < 2 ** -19  # 4 mantissa bits given up


def test_turboquant_codebook_is_lloyd_max_for_the_rotated_coordinates():
    c, b = ec.lloyd_max_normal(64, 2)
    sigma = 1 / 8
    # the 4-level Lloyd-Max quantizer of N(0, 1): +-0.4528, +-1.5104 (Max, 1960)
    assert [round(v / sigma, 3) for v in c] == [-1.510, -0.453, 0.453, 1.510]
    assert all(abs(bi - (c[i] + c[i + 1]) / 2) < 1e-12 for i, bi in enumerate(b))


def test_turboquant_keys_norm_and_rotation():
    x = _x(1)
    y = ec.apply("turboquant4_nc", x)
    # norm correction: the code vector is unit length, so each key keeps its fp16-rounded norm
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1).half().float(), rtol=1e-5)
    y3 = ec.apply("turboquant3", x)
    assert (y3 - x).norm() > (y - x).norm()  # fewer levels, larger error
    with pytest.raises(ValueError, match="power-of-two head_dim"):
        ec.apply("turboquant4", torch.randn(2, 96))


def test_sglang_mxfp4_scale_and_ties():
    x = torch.zeros(1, 16)
    x[0, 0], x[0, 1], x[0, 2] = 6.0, 0.25, -1.25  # |x|max 6: scale 2^ceil(log2(1)) = 1
    y = ec.sglang_mxfp4_16(x)
    assert y[0, 0] == 6.0 and y[0, 1] == 0.5 and y[0, 2] == -1.5  # ties round up in magnitude
    x[0, 0] = 6.5  # scale 2^ceil(log2(6.5 / 6)) = 2
    y = ec.sglang_mxfp4_16(x)
    assert y[0, 0] == 6.0 and y[0, 1] == 0.0


def test_nvfp4_codecs():
    x = _x(2)
    assert torch.equal(ec.apply("nvfp4_ts1", x), kvlab.quant.fake_quantize(x, "nvfp4", tensor_scale=1.0).float())
    g = x.reshape(-1, 16)
    e6 = ((ec.apply("nvfp4_ts1", x).reshape(-1, 16) - g) ** 2).sum(-1)
    e46 = ((ec.apply("nvfp4_4over6", x).reshape(-1, 16) - g) ** 2).sum(-1)
    assert (e46 <= e6 + 1e-6).all() and (e46 < e6 - 1e-6).any()  # the better of two scales, per 16 values


def test_torch_fp8_cast_is_the_cuda_one():
    y = ec.apply("torch_fp8_e4m3", torch.tensor([440.0, 464.0, 470.0, -1000.0, 3.3, float("nan")]))
    assert y[:2].tolist() == [448.0, 448.0] and math.isnan(y[2]) and math.isnan(y[3]) and y[4] == 3.25
    assert math.isnan(y[5])
    y = ec.apply("torch_fp8_e5m2", torch.tensor([57344.0, 70000.0, -70000.0]))
    assert y.tolist() == [57344.0, float("inf"), float("-inf")]


def test_spec_text_falls_through_to_the_oracle():
    x = _x(3)
    assert torch.equal(ec.apply("q8_0", x), kvlab.quant.fake_quantize(x, "q8_0").float())


def _iq4_nl_block_by_hand(x):
    """llama.cpp's quantize_row_iq4_nl_impl for one block of 32 (ntry = -1, no importance weights), as a loop."""
    vals = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]
    amax, mx = 0.0, 0.0
    for v in x:
        if abs(v) > amax:
            amax, mx = abs(v), v
    if amax < 1e-15:
        return [0.0] * 32
    inv = 1.0 / (mx / vals[0])
    codes = []
    for v in x:
        a = inv * v
        if a <= vals[0]:
            codes.append(0)
        elif a >= vals[-1]:
            codes.append(15)
        else:
            mu = next(i for i in range(16) if vals[i] > a)
            codes.append(mu - 1 if a - vals[mu - 1] < vals[mu] - a else mu)
    sqx = sum(v * v * vals[c] * v for v, c in zip(x, codes))
    sq2 = sum(v * v * vals[c] ** 2 for v, c in zip(x, codes))
    d = float(torch.tensor(sqx / sq2).half())
    return [d * vals[c] for c in codes]


def test_ggml_iq4_nl_is_llama_cpps_quantizer():
    x = _x(4, shape=(8, 64))
    got = ec.ggml_iq4_nl(x).reshape(-1, 32)
    want = torch.tensor([_iq4_nl_block_by_hand(b.tolist()) for b in x.reshape(-1, 32)])
    assert torch.allclose(got, want, rtol=2 ** -10, atol=0)  # the fp16 scale may differ by one rounding
    assert (got == want).float().mean() > 0.99
    # a code tie goes to the larger value: 1 + 13 = 2 * 7 at scale 1 (max -127 fixes the scale)
    t = torch.zeros(1, 32)
    t[0, 0], t[0, 1] = -127.0, 7.0
    assert (ec.ggml_iq4_nl(t)[0, 1] / ec.ggml_iq4_nl(t)[0, 0] * -127).round() == 13


def test_ggml_iq4_nl_equals_llama_cpp_itself():
    """Against llama.cpp's own C function, where llama-cpp-python is installed (an optional dependency)."""
    import ctypes
    import os
    llama_cpp = pytest.importorskip("llama_cpp")
    import numpy as np
    lib = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
    lib.quantize_row_iq4_nl_ref.argtypes = lib.dequantize_row_iq4_nl.argtypes = [ctypes.c_void_p, ctypes.c_void_p,
                                                                               ctypes.c_int64]
    x = (_x(5, shape=(64, 128)) * 7).numpy().astype(np.float32)
    blocks, y = np.zeros(x.size // 32 * 18, np.uint8), np.zeros(x.size, np.float32)
    lib.quantize_row_iq4_nl_ref(x.ctypes.data, blocks.ctypes.data, x.size)
    lib.dequantize_row_iq4_nl(blocks.ctypes.data, y.ctypes.data, x.size)
    ours = ec.ggml_iq4_nl(torch.from_numpy(x)).numpy().ravel()
    assert np.allclose(ours, y, rtol=2 ** -10, atol=0) and (ours == y).mean() > 0.99
