"""Reference placement: pages written by write_tokens read back as the oracle's own QTensor."""
from __future__ import annotations

import pytest
import torch

import kvlab
from kvlab.cache.layout import PageLayout
from kvlab.cache.paging import calibrate, read_qtensor, read_values, write_tokens


@pytest.mark.parametrize("name", ["q4_0", "q5_1", "kivi4", "nvfp4", "int8:tensor", "int4_had", "mxfp4",
                                  "int6:head:asym", "fp8_e4m3:tensor:rule=absmax"])
def test_roundtrip_is_the_oracle(name):
    spec = kvlab.scheme(name).k
    T, Hk, D, P = 64, 2, 64, 32
    x = torch.randn(T, Hk, D) * 2
    lay = PageLayout(spec, D, P, Hk)
    pages = lay.allocate(4)
    s, ts = calibrate(x, spec)
    order = [2, 0]  # pages in token order
    slots = torch.cat([torch.arange(P) + p * P for p in order])
    write_tokens(x, pages, slots, spec, P, scale=s, tensor_scale=ts)
    kw = {k: v for k, v in (("scale", s), ("tensor_scale", ts)) if v is not None}
    want = kvlab.quantize(x.transpose(0, 1), spec, **kw)
    got = read_qtensor(pages, spec, order, T, D, scale=s, tensor_scale=ts)
    assert torch.equal(got.codes, want.codes)
    for a, b in ((got.scales, want.scales), (got.zeros, want.zeros)):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    assert torch.equal(read_values(pages, spec, order, T, D, scale=s, tensor_scale=ts), kvlab.dequantize(want))


def test_float_storage_roundtrip():
    spec = kvlab.scheme("bf16").k
    x = torch.randn(20, 2, 64)
    pages = PageLayout(spec, 64, 16, 2).allocate(3)
    write_tokens(x, pages, torch.arange(20) + 16, spec, 16)
    assert torch.equal(read_values(pages, spec, [1, 2], 20, 64), x.to(torch.bfloat16).float().transpose(0, 1))


def test_calibrate():
    x = torch.randn(10, 2, 64)
    x[0, 0, 0] = float("nan")
    s, ts = calibrate(x, kvlab.parse_spec("fp8_e4m3:tensor:rule=absmax"))
    assert ts is None and s == x.nan_to_num(0).abs().amax() / 448
    s, ts = calibrate(x, kvlab.scheme("nvfp4").k)
    assert s is None and ts == x.nan_to_num(0).abs().amax() / (6 * 448)
    assert calibrate(torch.zeros(3, 1, 64), kvlab.parse_spec("int8:tensor"))[0] == 1.0
    assert calibrate(x, kvlab.scheme("q4_0").k) == (None, None)
