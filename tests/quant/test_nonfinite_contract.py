"""The non-finite contract of the oracle, as properties over formats x scale dtypes x group sizes x axes:

1. a NaN / +inf / -inf input makes its own group dequantize to NaN (never to finite values);
2. every other group is bit-identical (codes, scales, zeros) to the same tensor with that value made 0;
3. finite groups (subnormal, huge, all zero) never reach other groups either, and all-zero / subnormal
   groups stay finite;
4. defaults computed over the whole tensor (NVFP4's second-level scale) ignore non-finite values.

A group here is what one scale covers: `g` elements of a token (axis tok), `g` tokens of a channel (chan),
a token row (head), the whole tensor (tensor with a scale rule), a single element (fp8 without a scale).
A Hadamard rotation mixes a whole token row, so for rotated specs the row is the unit. Int codes cannot
hold NaN, so an axis-tensor int spec whose static scale is *given* saturates a non-finite input (the
pool calibrates its static scales over finite values only; tested in the pool tests).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import kvlab
from kvlab.spec import KVQuantSpec

FMTS = [("int", b) for b in range(2, 9)] + [("fp8_e4m3", 8), ("fp8_e5m2", 8), ("fp4_e2m1", 4), ("nf4", 4),
                                            ("iq4nl", 4)]
SPECIALS = {"nan": float("nan"), "+inf": float("inf"), "-inf": -float("inf")}
FINITE = {"subnormal": 1e-40, "huge": 1e30, "zero": 0.0}
N, D = 64, 64  # tokens, head_dim


@st.composite
def specs(draw) -> KVQuantSpec:
    fmt, bits = draw(st.sampled_from(FMTS))
    axis = draw(st.sampled_from(["tok", "tok", "chan", "head", "tensor"]))
    kw = dict(fmt=fmt, bits=bits, axis=axis, group=draw(st.sampled_from([16, 32, 64])) if axis in ("tok", "chan") else 0,
              sym=draw(st.booleans()) if fmt == "int" and axis != "tensor" else True,
              scale_dtype=draw(st.sampled_from(["f16", "bf16", "f32", "e8m0", "e4m3"])),
              rule=draw(st.sampled_from(["absmax", "absmax", "signed", "mse", "unit"])),
              rotation=draw(st.sampled_from(["none", "none", "had"])))
    kw["tensor_scale"] = kw["scale_dtype"] == "e4m3" and fmt != "int" and draw(st.booleans())
    try:
        return KVQuantSpec(**kw)
    except ValueError:
        assume(False)


def _group_mask(spec: KVQuantSpec, t: int, d: int) -> torch.Tensor:
    """[N, D] True where an element shares a scale (or a rotation) with element (t, d)."""
    m = torch.zeros(N, D, dtype=torch.bool)
    if spec.rotation == "had":  # the rotation spreads (t, d) over the whole row t first
        for dd in range(D):
            m |= _group_mask(dataclasses.replace(spec, rotation="none"), t, dd)
    elif not spec.has_scale:  # fp8 without a scale: the element alone
        m[t, d] = True
    elif spec.axis == "tensor":
        m[:] = True
    elif spec.axis == "head":
        m[t] = True
    elif spec.axis == "tok":
        g = spec.group
        m[t, d // g * g:(d // g + 1) * g] = True
    elif spec.axis == "chan":
        g = spec.group
        m[t // g * g:(t // g + 1) * g, d] = True
    return m


def _quantize(x, spec, **kw):
    q = kvlab.quantize(x, spec, **kw)
    return q, kvlab.dequantize(q)


def _fixed_ts(spec):
    return {"tensor_scale": 0.01} if spec.tensor_scale else {}


def _x(seed: int) -> torch.Tensor:
    return torch.randn(N, D, generator=torch.Generator().manual_seed(seed)) * 2


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(spec=specs(), kind=st.sampled_from(list(SPECIALS)), t=st.integers(0, N - 1), d=st.integers(0, D - 1),
       seed=st.integers(0, 3))
def test_non_finite_poisons_only_its_own_group(spec, kind, t, d, seed):
    assume(not (spec.static_scale and spec.fmt == "int"))  # int codes hold no NaN: see the module docstring
    x = _x(seed)
    bad, ref = x.clone(), x.clone()
    bad[t, d], ref[t, d] = SPECIALS[kind], 0.0
    kw = _fixed_ts(spec)
    _, y_bad = _quantize(bad, spec, **kw)
    _, y_ref = _quantize(ref, spec, **kw)
    own = _group_mask(spec, t, d)
    assert torch.isnan(y_bad[own]).all(), f"{spec}: {kind} left {int((~torch.isnan(y_bad[own])).sum())} finite"
    assert torch.equal(y_bad[~own], y_ref[~own]), f"{spec}: {kind} changed other groups"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(spec=specs(), kind=st.sampled_from(list(FINITE)), t=st.integers(0, N - 1), d=st.integers(0, D - 1),
       seed=st.integers(0, 3))
def test_finite_extremes_stay_in_their_group(spec, kind, t, d, seed):
    """A subnormal, huge or all-zero group is quantized alone: every other group is bit-identical to the
    same tensor without it, and subnormal / zero groups stay finite."""
    assume(not spec.static_scale)  # a tensor-wide scale is the whole tensor's group
    x = _x(seed)
    own = _group_mask(spec, t, d)
    odd = x.clone()
    odd[own] = FINITE[kind] * torch.sign(x[own]) if kind != "zero" else 0.0
    kw = _fixed_ts(spec)
    q_odd, y_odd = _quantize(odd, spec, **kw)
    _, y_ref = _quantize(x, spec, **kw)
    assert torch.equal(y_odd[~own], y_ref[~own]), f"{spec}: a {kind} group changed other groups"
    if kind != "huge":
        assert torch.isfinite(y_odd).all(), f"{spec}: a {kind} group made non-finite values"


@pytest.mark.parametrize("name", ["nvfp4", "fp4:g16:s=e4m3:ts", "nf4:g16:s=e4m3:ts"])
@pytest.mark.parametrize("kind", list(SPECIALS))
def test_default_tensor_scale_ignores_non_finite_values(name, kind):
    """The issue's case: one inf in [2, 64, 64] made nvfp4's default tensor scale inf and every value NaN."""
    spec = kvlab.scheme(name).k
    x = torch.randn(2, 64, 64, generator=torch.Generator().manual_seed(1))
    bad, ref = x.clone(), x.clone()
    bad[1, 37, 35], ref[1, 37, 35] = SPECIALS[kind], 0.0
    q_bad, y_bad = _quantize(bad, spec)
    q_ref, y_ref = _quantize(ref, spec)
    assert torch.equal(q_bad.tensor_scale, q_ref.tensor_scale) and torch.isfinite(q_bad.tensor_scale)
    own = torch.zeros_like(x, dtype=torch.bool)
    own[1, 37, 32:48] = True
    assert torch.isnan(y_bad[own]).all() and torch.equal(y_bad[~own], y_ref[~own])


@pytest.mark.parametrize("name", ["nvfp4", "fp4:g16:s=e4m3", "int4:g32:s=e4m3", "nf4:g32:s=e4m3"])
def test_inf_with_e4m3_group_scales_is_nan_not_448(name):
    """The issue's case: the e4m3 scale store clamped +inf to 448, so an inf came back finite (0.0)."""
    x = torch.randn(2, 64)
    x[0, 3] = float("inf")
    spec = kvlab.scheme(name).k
    y = kvlab.dequantize(kvlab.quantize(x, spec, **({"tensor_scale": 0.01} if spec.tensor_scale else {})))
    g = spec.group
    assert torch.isnan(y[0, :g]).all() and torch.isfinite(y[0, g:]).all() and torch.isfinite(y[1]).all()


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
def test_unscaled_fp8_saturates_finite_values_but_not_inf(fmt):
    x = torch.tensor([[1e6, -1e6, float("inf"), -float("inf"), float("nan"), 1.0, 0.0, -2.5]])
    y = kvlab.dequantize(kvlab.quantize(x, fmt))[0]
    m = 448.0 if fmt == "fp8_e4m3" else 57344.0
    assert y[0] == m and y[1] == -m and torch.isnan(y[2:5]).all() and torch.equal(y[5:], x[0, 5:])


def test_given_static_int_scale_saturates_non_finite_inputs():
    """Documented exception: an axis-tensor int spec with a *given* scale has no NaN code."""
    x = torch.tensor([[1.0, float("inf"), -float("inf"), 0.5] * 2])
    y = kvlab.dequantize(kvlab.quantize(x, "int8:tensor", scale=0.01))[0]
    assert torch.allclose(y[:4], torch.tensor([1.0, 1.27, -1.28, 0.5]))


@pytest.mark.parametrize("n", [1, 3, 8, 16, 33, 64])
def test_nan_scales_are_stored_as_one_canonical_nan(n):
    """A NaN group scale is stored as the positive quiet NaN whatever the tensor's size (torch's vectorized CPU cast
    to bf16 writes 0xFFFF, its scalar one 0x7FC0): bf16 0x7FC0, f16 0x7E00, f32 0x7FC00000, as the store kernel
    writes them, so conformance bytes do not depend on the CPU or the tensor's length."""
    from kvlab.quant.formats import store_scale
    s = torch.full((n,), float("nan"))
    s[::2] = 1.5
    want = {"bf16": (torch.int16, 0x7FC0), "f16": (torch.int16, 0x7E00), "f32": (torch.int32, 0x7FC00000)}
    for dt, (it, bits) in want.items():
        got = store_scale(s, dt).view(it)[1::2].to(torch.int64) & ((1 << (8 * it.itemsize)) - 1)
        assert (got == bits).all(), (dt, [hex(v) for v in got.tolist()])
        assert (store_scale(s, dt)[::2].float() == 1.5).all()
