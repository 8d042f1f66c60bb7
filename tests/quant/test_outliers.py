"""Outlier slots (`out=N`): the spec option, the oracle's dense-and-sparse split, the pages that hold it."""
from __future__ import annotations

import pytest
import torch

from kvlab.cache.capacity import layout_page_bytes
from kvlab.cache.layout import PageLayout
from kvlab.quant import dequantize, fake_quantize, quantize
from kvlab.quant import outliers as slots
from kvlab.spec import parse_spec

SPECS = ["int3:g32:asym:out=2", "int2:g16:sym:out=1", "int4:g32:chan:asym:out=3", "nf4:out=4",
         "lm3:g64:rot=had:out=1", "int4:head:asym:out=2", "fp4_e2m1:g32:out=1", "fp8_e4m3:out=2"]


def _x(T=32, D=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, T, D, generator=g)
    x[..., 5] *= 30  # an outlier channel
    x[0, 3, 40] = -200.0  # and a per-token outlier
    return x


@pytest.mark.parametrize("name", SPECS)
def test_packed_and_fake_quantize_agree(name):
    """dequantize(quantize(x)) is fake_quantize(x), bit for bit, slots included; slots are uint8 / fp16 [..., T, N]."""
    spec = parse_spec(name)
    x = _x()
    q = quantize(x, spec)
    assert q.out_idx.dtype == torch.uint8 and q.out_val.dtype == torch.float16
    assert tuple(q.out_idx.shape) == (2, 32, spec.outliers) == tuple(q.out_val.shape)
    assert torch.equal(dequantize(q), fake_quantize(x, spec))


@pytest.mark.parametrize("name", [s for s in SPECS if "rot=had" not in s])
def test_slots_hold_the_largest_values_exactly(name):
    """Unrotated specs: the N largest magnitudes of each token come back as their fp16 values, at their channels."""
    spec = parse_spec(name)
    x = _x()
    y = fake_quantize(x, spec)
    top = x.abs().topk(spec.outliers, -1).indices
    assert torch.equal(y.gather(-1, top), x.gather(-1, top).half().float())


def test_slots_make_the_error_smaller_where_outliers_widen_scales():
    x = _x()
    base = ((fake_quantize(x, "int3:g32:asym") - x) ** 2).mean()
    one = ((fake_quantize(x, "int3:g32:asym:out=1") - x) ** 2).mean()
    two = ((fake_quantize(x, "int3:g32:asym:out=2") - x) ** 2).mean()
    assert two < one < base / 4


def test_selection_order_ties_and_non_finite():
    """NaN and inf rank first, then magnitudes; ties go to the lower channel. A non-finite value in a slot stays in its
    element (its group's other values stay finite)."""
    x = torch.tensor([[1.0, -3.0, 3.0, 0.5, float("nan"), 2.0, -float("inf"), 0.25]])
    idx, val, mask = slots.select(x, 3)
    assert idx.tolist() == [[4, 6, 1]]  # NaN and -inf (in channel order: stable), then -3 before +3 (lower channel)
    assert torch.isnan(val[0, 0]) and val[0, 1] == -float("inf") and val[0, 2] == -3.0
    assert mask.sum() == 3
    y = fake_quantize(x, "int4:g8:asym:out=2")
    assert torch.isnan(y[0, 4]) and y[0, 6] == -float("inf")
    assert torch.isfinite(y[0, [0, 1, 2, 3, 5, 7]]).all()


def test_fill_is_the_mean_of_the_rest():
    xg = torch.tensor([[1.0, 100.0, 3.0, 5.0], [7.0, 7.0, 7.0, 7.0]])
    mg = torch.tensor([[False, True, False, False], [True, True, True, True]])
    assert slots.fill(xg, mg).tolist() == [[1.0, 3.0, 3.0, 5.0], [0.0, 0.0, 0.0, 0.0]]


def test_group_scale_ignores_its_outlier():
    """The dense codes of a group with a slot are those of the group with the slot's element at the others' mean."""
    x = torch.tensor([[0.1, -0.2, 0.3, 50.0, 0.05, -0.1, 0.2, 0.15]])
    q = quantize(x, "int4:g8:asym:out=1")
    rest = x.clone()
    rest[0, 3] = torch.cat([x[0, :3], x[0, 4:]]).mean()
    ref = quantize(rest, "int4:g8:asym")
    assert torch.equal(q.scales, ref.scales) and torch.equal(q.zeros, ref.zeros) and torch.equal(q.codes, ref.codes)


def test_spec_text_bits_and_bytes():
    s = parse_spec("int3:g32:asym:out=2")
    assert str(s) == "int3:g32:asym:out=2" and parse_spec(str(s)) == s
    assert s.bits_per_element_at(64) == pytest.approx(3 + 32 / 32 + 2 * 24 / 64)
    assert s.bits_per_element_at(128) == pytest.approx(4 + 2 * 24 / 128)
    lay = PageLayout(s, 64, 16, 2)
    pages = lay.allocate(3)
    stored = sum(t.numel() * t.element_size() for t in pages.values() if t is not None)
    assert stored == 3 * layout_page_bytes(lay) == 3 * 16 * 2 * lay.bytes_per_token()
    assert tuple(pages["out_idx"].shape) == (3, 2, 16, 2) and pages["out_val"].dtype == torch.float16


@pytest.mark.parametrize("text, match", [
    ("int3:out=0", "allowed: out=1..8"), ("int3:out=9", r"0\.\.8"), ("int3:out=2x", "allowed: out=1..8"),
    ("bf16:out=1", "stores every value"), ("int4:g32:prerope:out=1", "prerope"),
])
def test_bad_outlier_options_are_named(text, match):
    with pytest.raises(ValueError, match=match):
        parse_spec(text)


def test_head_dim_must_leave_room_and_fit_uint8():
    with pytest.raises(ValueError, match="head_dim in 9..256"):
        quantize(torch.randn(4, 8), "int4:g8:out=8")


def test_missing_or_bad_slots_are_refused():
    q = quantize(_x(), "int3:g32:asym:out=2")
    q.out_val = None
    with pytest.raises(ValueError, match="keeps 2 outlier slots"):
        dequantize(q)
    lay = PageLayout(parse_spec("int3:g32:asym:out=2"), 64, 16, 2)
    pages = lay.allocate(2)
    pages["out_idx"] = pages["out_idx"][..., :1]
    with pytest.raises(ValueError, match=r"pages\['out_idx'\]"):
        lay.check_pages(pages, "cpu")
    plain = PageLayout(parse_spec("int3:g32:asym"), 64, 16, 2).allocate(2)
    plain["out_val"] = torch.zeros(2, 2, 16, 1, dtype=torch.float16)
    with pytest.raises(ValueError, match="keeps no outlier slots"):
        PageLayout(parse_spec("int3:g32:asym"), 64, 16, 2).check_pages(plain, "cpu")


@pytest.mark.parametrize("name", ["int3:g32:asym:out=2", "int4:g32:chan:asym:out=1", "nf4:out=3"])
def test_engine_bytes_carry_the_slots(name):
    """encode appends each token's slots (N fp16 values, then N uint8 indices) to its row; decode_bytes reads them."""
    from kvlab.quant import decode_bytes, encode
    spec = parse_spec(name)
    x = _x(T=64)
    b = encode(x, spec)
    assert torch.equal(decode_bytes(b, spec, x.shape), fake_quantize(x, spec))
    q = quantize(x, spec)
    n = spec.outliers
    rows = torch.from_numpy(b)
    tok = rows.reshape(2, 64, -1) if spec.axis != "chan" else rows[..., -spec.group * 3 * n:].reshape(2, 64, 3 * n)
    assert torch.equal(tok[..., -n:], q.out_idx)
    assert torch.equal(tok[..., -3 * n:-n].contiguous().view(torch.float16), q.out_val)
