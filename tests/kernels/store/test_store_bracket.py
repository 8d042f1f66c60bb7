"""The store's bin-table bracket for fixed ascending codebooks (`kvlab.kernels.tiles.bracket`): the table's
invariants, and the kernel's codes equal to the oracle's on the values where a bracket can go wrong (every level and
midpoint, a few ulps either side, every bin edge, past both ends), with the rare fallback off on the interpreter so the
table path alone decides."""
from __future__ import annotations

import zlib

import pytest
import torch
from store_cases import DEV, assert_same_pages, run_store, spec_of

from kvlab.cache.layout import PageLayout
from kvlab.cache.paging import calibrate
from kvlab.kernels.tiles.bracket import BINS, SLACK, bracket_table

FIXED = ["nf4", "iq4nl", "lm4:g32", "mxfp4", "nvfp4", "iq4nl:g32:rule=signed", "lm4:g64:rot=had"]


def test_table_invariants():
    """Each bin holds c with every midpoint left of the bin (less a slack) counted, at most one midpoint inside; the
    first bin 0, the last N - 2; the smallest K that works; None for levels not strictly ascending."""
    levels = (-1.0, -0.5, 0.0, 0.25, 1.0)
    t = bracket_table(levels)
    mids = [(a + b) / 2 for a, b in zip(levels, levels[1:])]
    k = len(t)
    assert k in BINS and t[0] == 0 and t[-1] == len(levels) - 2
    w = 2.0 / k
    for g, c in enumerate(t):
        a, b = -1.0 + g * w - SLACK * w, -1.0 + (g + 1) * w + SLACK * w
        assert sum(a <= m <= b for m in mids) <= 1
        assert c == min(sum(m < a for m in mids), len(levels) - 2)
    assert k == 16
    # midpoints at 0.005 and 0.015 over a range of 2 share every bin wider than 1/128: K = 256
    assert len(bracket_table((-1.0, 0.0, 0.01, 0.02, 1.0))) == 256
    assert bracket_table((0.0, 1e-6, 2e-6, 1.0)) is None  # bins of 1e-6 would be needed: no table, bisection
    assert bracket_table((0.0, 1.0, 1.0, 2.0)) is None
    assert bracket_table((1.0, 0.0)) is None


def _hard_values(fmt: str) -> torch.Tensor:
    """Levels, midpoints and bin edges of `fmt` (in units of the largest level), each also 1..3 ulps either side."""
    import kvlab.kernels.store.triton as st
    lv = torch.tensor(st._levels(fmt), dtype=torch.float64)
    k = st.lut_bins(fmt)
    edges = lv[0] + (lv[-1] - lv[0]) * torch.arange(k + 1, dtype=torch.float64) / k
    pts = torch.cat([lv, (lv[1:] + lv[:-1]) / 2, edges]).float()
    pts = pts / pts.abs().max()
    out, up, dn = [pts], pts, pts
    for _ in range(3):
        up, dn = torch.nextafter(up, up + 1), torch.nextafter(dn, dn - 1)
        out += [up, dn]
    return torch.cat(out)


@pytest.mark.parametrize("lut", [True, False], ids=["table", "bisection"])
@pytest.mark.parametrize("name", FIXED)
def test_bracket_codes_exact(name, lut, monkeypatch, request):
    """Codes, scales (and tensor scales) equal to the oracle's with the table (LUT > 0) and with the bisection; the
    values sit on levels, midpoints and bin edges and a few ulps off them, scaled by exact and by odd scales, both
    signs, a group past both ends; on the interpreter with the rare fallback off (the fast path alone). e2m1's
    arithmetic codes (`E2M1_POW2`, `E2M1_ARITH`) are off here: `test_e2m1_arithmetic_codes_exact` checks them."""
    import kvlab.kernels.store.triton as st
    monkeypatch.setattr(st, "BRACKET_LUT", lut)
    monkeypatch.setattr(st, "E2M1_POW2", False)
    monkeypatch.setattr(st, "E2M1_ARITH", False)
    st.kernel_params.cache_clear()  # (params are cached per spec; cleared again after the test)
    request.addfinalizer(st.kernel_params.cache_clear)
    assert (st.kernel_params(spec_of(name), 64)["LUT"] > 0) == lut
    assert st.kernel_params(spec_of("lm2:g64"), 64)["LUT"] == 0  # (lm2 / lm3 bisect: measured faster)
    assert st.kernel_params(spec_of("lm3:g64"), 64)["LUT"] == 0
    _check_hard_values(name, monkeypatch, f"lut={lut}")


@pytest.mark.parametrize("name,mode", [("mxfp4", -1), ("fp4_e2m1:g32:s=e8m0:rot=had", -1), ("fp4_e2m1:g16:s=e8m0", -1),
                                       ("nvfp4", -2), ("fp4_e2m1:g32:s=f16", -2), ("fp4_e2m1:g16:s=e4m3", -2),
                                       ("fp4_e2m1:g32:s=e4m3:rot=had", -2)])
def test_e2m1_arithmetic_codes_exact(name, mode, monkeypatch, request):
    """fp4 e2m1 codes by arithmetic, no bin table: under a power-of-two scale (`tiles.bracket.e2m1_pow2_codes`, LUT -1:
    e8m0 scales without a tensor scale) and under any other (`e2m1_bracket_codes`, LUT -2: the bracket and its levels
    built from t's bits): the oracle's codes on every level, midpoint and bin edge and a few ulps either side, exact
    and odd scales, both signs, past both ends. Each switch off gives the table back."""
    import kvlab.kernels.store.triton as st
    st.kernel_params.cache_clear()
    request.addfinalizer(st.kernel_params.cache_clear)
    assert st.kernel_params(spec_of(name), 64)["LUT"] == mode
    monkeypatch.setattr(st, "E2M1_POW2" if mode == -1 else "E2M1_ARITH", False)
    st.kernel_params.cache_clear()
    assert st.kernel_params(spec_of(name), 64)["LUT"] == (-2 if mode == -1 else st.lut_bins("fp4_e2m1"))
    monkeypatch.undo()
    st.kernel_params.cache_clear()
    _check_hard_values(name, monkeypatch, f"e2m1 by arithmetic ({mode})")


def _check_hard_values(name, monkeypatch, what):
    import kvlab.kernels.store.triton as st
    spec = spec_of(name)
    fmt = spec.fmt
    vals = _hard_values(fmt)
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()) % 1000)
    D, T = 64, 32
    x = vals[torch.randint(0, len(vals), (T, 1, D), generator=g)]
    x[:, 0, 0] = 1.0  # the largest level: absmax groups keep an exact power-of-two scale
    x[: T // 2] *= 2.0 ** torch.randint(-3, 4, (T // 2, 1, 1), generator=g).float()
    x[T // 2:] *= torch.exp(torch.randn(T // 2, 1, 1, generator=g))  # odd scales
    x[1::2] = -x[1::2]
    x[3, 0, 5] = 20.0  # an outlier past the end levels (within the bracket's 32 times)
    x[3, 0, 6] = -20.0
    lay = PageLayout(spec, D, 16, 1)
    if DEV == "cpu":  # the interpreter reads the global at run time
        monkeypatch.setattr(st, "RARE_PATHS", False)
    slots = torch.arange(T, device=DEV)
    s, ts = calibrate(x, spec)
    kw = {k: v for k, v in (("scale", s), ("tensor_scale", ts)) if v is not None}
    ref, _ = run_store(x.to(DEV), slots, lay, 2, spec, "reference", **kw)
    tri, used = run_store(x.to(DEV), slots, lay, 2, spec, "triton", **kw)
    assert used == "triton"
    assert_same_pages(ref, tri, f"{name} {what}")


def test_group_level_rare_check_only_where_the_scale_bounds_x():
    """BOUND (the sorted brackets' rare check per group, not per element) only where the group's own scale bounds
    |x| / s: absmax / signed / rms / e8m0 scales of codebooks and calibrated ints; never for static (axis tensor) or
    unit scales, e4m3 group scales or a tensor scale (e4m3 saturates), nor for the formats without a bracket."""
    from kvlab.kernels.store.triton import kernel_params
    bound = {n: kernel_params(spec_of(n), 64)["BOUND"] for n in (
        "nf4", "iq4nl:g32:rule=signed", "mxfp4", "lm2:g64", "lm4:g64:rot=had", "int2:g32:chan:asym:cal",
        "nvfp4", "nf4:s=e4m3", "lm2:g64:s=e4m3", "nf4:tensor", "q4_0", "int4:g32:asym", "fp8_e4m3")}
    assert [n for n, b in bound.items() if b] == ["nf4", "iq4nl:g32:rule=signed", "mxfp4", "lm2:g64",
                                                  "lm4:g64:rot=had", "int2:g32:chan:asym:cal"], bound
