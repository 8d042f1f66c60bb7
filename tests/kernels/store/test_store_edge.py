"""Store edge values: all-zero groups, exact .5 ties, signed extremes, NaN / inf groups, tiny and huge
groups, decode-sized and prefill-sized batches, skipped slots. Triton == reference (oracle)."""
from __future__ import annotations

import dataclasses
import zlib

import pytest
import torch
import triton
import triton.language as tl
from store_cases import (DEV, POISON, as_bytes, assert_same_pages, make_input, page_size_for, run_store, spec_id,
                         spec_of)

from kvlab.cache.layout import PageLayout
from kvlab.cache.paging import calibrate
from kvlab.kernels.configs import StoreConfig

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

EDGE_SPECS = ["q4_0", "q4_1", "q8_0", "q5_1", "int3:g32:asym", "int2:g32:asym", "freetoken:q4_0", "freetoken:q6_0",
              "int4_had", "mxfp4", "nvfp4", "nf4", "iq4nl", "fp8_e4m3", "freetoken:fp8_e4m3", "fp8_e5m2", "bf16",
              "fp16", "int4:g32:chan:asym", "int4:g32:chan:sym:rnd=away", "int8:tensor", "int5:g16:sym:rnd=up:recip"]
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn)


def edge_input(spec, D=64):
    """x [T, 1, D] of dyadic values (exact .5 ties for many scales) with special groups:
    tok: (token, group) = (0,0) zeros, (0,1) ties, (1,0) NaN, (1,1) +inf, (2,0) tiny, (2,1) huge,
    (3,*) signed extremes; chan: channels 0..6 take those roles over the first token group."""
    g = torch.Generator().manual_seed(7)
    chan = spec.axis == "chan"
    G = spec.group if spec.axis in ("tok", "chan") else D
    T = max(spec.group, 8) if chan else 8
    x = torch.randint(-16, 17, (T, 1, D), generator=g).float() / 2
    ties = torch.tensor([7.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, -3.5, 5.5, -6.5, 4.5] * 32)
    special = {"zero": torch.zeros(512), "ties": ties, "tiny": torch.randn(512, generator=g) * 1e-30,
               "huge": torch.randn(512, generator=g) * 1e6, "ext": torch.tensor([-4.0, 4.0, 1.0, -1.0] * 128),
               "ext2": torch.tensor([4.0, -4.0, 0.5, 1.0] * 128)}
    if chan:
        for c, name in enumerate(special):
            x[:G, 0, c] = special[name][:G]
        x[3, 0, 7] = float("nan")
        x[5, 0, 8] = float("inf")
    else:
        Gs = min(G, D // 2) if spec.axis == "tok" else D // 2
        for (t, grp), name in zip([(0, 0), (0, 1), (2, 0), (2, 1), (3, 0), (3, 1)], special):
            x[t, 0, grp * Gs:(grp + 1) * Gs] = special[name][:Gs]
        x[1, 0, 5] = float("nan")
        x[1, 0, Gs + 3] = float("inf")
    return x


def _fp8_nan_codes(t: torch.Tensor, fmt: str) -> torch.Tensor:
    """fp8 codes with every NaN code as 0x7F: the sign of a NaN that arithmetic creates (inf / inf in a
    scaled group) is the platform's default NaN (negative on x86, where the oracle runs; positive on
    CUDA), as the store API documents for NaN payloads. Only scaled fp8 specs make such NaNs: unscaled
    ones are compared with the sign (an input NaN keeps it)."""
    mag = t & 0x7F
    nan = (mag == 0x7F) if fmt == "fp8_e4m3" else (mag > 0x7C)
    return torch.where(nan, torch.full_like(t, 0x7F), t)


def _nan_aware_equal(a: dict, b: dict, msg: str, spec=None):
    for key, ta in a.items():
        tb = b[key]
        if ta is None:
            assert tb is None
            continue
        ta, tb = ta.cpu(), tb.cpu()  # the reference pages live on the CPU, the kernel's on DEV
        if key == "codes" and spec is not None and spec.fmt.startswith("fp8") and spec.has_scale and DEV == "cuda":
            ta, tb = _fp8_nan_codes(ta.view(torch.uint8), spec.fmt), _fp8_nan_codes(tb.view(torch.uint8), spec.fmt)
        if ta.dtype in _FLOATS:
            na, nb = torch.isnan(ta.float()), torch.isnan(tb.float())
            assert torch.equal(na, nb), f"{msg}: {key} NaN positions differ"
            it = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[ta.element_size()]  # compare bits, not values
            assert torch.equal(ta.view(it)[~na].cpu(), tb.view(it)[~na].cpu()), f"{msg}: {key} differs"
            continue
        assert torch.equal(ta.view(torch.uint8).cpu(), tb.view(torch.uint8).cpu()), f"{msg}: {key} differs"


@pytest.mark.parametrize("name", EDGE_SPECS, ids=[f"edge-D64-{spec_id(n)}" for n in EDGE_SPECS])
def test_edge_values(name):
    spec = spec_of(name)
    x = edge_input(spec).to(DEV)
    T = x.shape[0]
    P = max(16, spec.group) if spec.axis == "chan" else 16
    lay, n_pages = PageLayout(spec, 64, P, 1), -(-T // P) + 1
    slots = torch.arange(T, device=DEV) + P  # skip page 0
    s, ts = calibrate(x, spec)
    kw = {k: v for k, v in (("scale", s), ("tensor_scale", ts)) if v is not None}
    ref, _ = run_store(x, slots, lay, n_pages, spec, "reference", **kw)
    tri, _ = run_store(x, slots, lay, n_pages, spec, "triton", **kw)
    _nan_aware_equal(ref, tri, name, spec)
    assert (as_bytes(tri)["codes"][0] == POISON).all()  # page 0 untouched
    if spec.axis == "tok" and spec.rotation == "none" and spec.has_scale:
        # the NaN group poisons only itself: token 1's other groups equal a run without the NaN
        clean = x.clone()
        clean[1, 0, 5] = 0.0
        tri2, _ = run_store(clean, slots, lay, n_pages, spec, "triton", **kw)
        a, b = as_bytes(tri), as_bytes(tri2)
        GB = spec.group * spec.bits // 8
        a["codes"][1, 0, 1, :GB] = b["codes"][1, 0, 1, :GB]  # token 1 sits at page 1, offset 1
        for key in ("scales", "zeros"):
            if tri[key] is not None:
                nb = tri[key].element_size()  # the NaN group's own scale / zero bytes
                a[key][1, 0, 1, :nb] = b[key][1, 0, 1, :nb]
        for key in a:
            if a[key] is not None:
                assert torch.equal(a[key], b[key]), f"{key}: a NaN changed another group"
        sc = tri["scales"][1, 0, 1, 0]
        assert int(sc) == 255 if spec.scale_dtype == "e8m0" else torch.isnan(sc.float()), "NaN group's scale"


@pytest.mark.parametrize("name", ["q4_0", "kivi4", "mxfp4", "int3:g32:asym", "bf16"])
def test_decode_batch(name):
    """T = batch of one token per sequence, slots scattered over pages (chan: one group per sequence)."""
    spec = spec_of(name)
    x, slots, lay, n_pages, kw = make_input(spec, T=5, Hk=4, D=64, seed=3)
    assert_same_pages(run_store(x, slots, lay, n_pages, spec, "reference", **kw)[0],
                      run_store(x, slots, lay, n_pages, spec, "triton", **kw)[0], name)


@pytest.mark.parametrize("name,T", [("q4_0", 300), ("kivi4", 320), ("fp8_e4m3", 257)],
                         ids=["prefill-T300-q4_0", "prefill-T320-kivi4", "prefill-T257-fp8"])
def test_prefill(name, T):
    spec = spec_of(name)
    x, slots, lay, n_pages, kw = make_input(spec, T=T, Hk=2, D=64, P=16, seed=4)
    assert_same_pages(run_store(x, slots, lay, n_pages, spec, "reference", **kw)[0],
                      run_store(x, slots, lay, n_pages, spec, "triton", **kw)[0], name)


@pytest.mark.parametrize("name", ["q4_1", "int4:g32:chan:asym"])
def test_minus_one_slots_skip(name):
    spec = spec_of(name)
    x, slots, lay, n_pages, kw = make_input(spec, T=64, seed=5)
    G = spec.group if spec.axis == "chan" else 1
    slots = slots.clone().reshape(-1, G)
    slots[1::2] = -1
    slots = slots.reshape(-1)
    ref, _ = run_store(x, slots, lay, n_pages, spec, "reference", **kw)
    tri, _ = run_store(x, slots, lay, n_pages, spec, "triton", **kw)
    assert_same_pages(ref, tri, name)
    written = int((as_bytes(tri)["codes"] != POISON).any(-1).sum())
    assert 0 < written


FLAT_SPECS = ["q4_0", "q4_1", "q8_0", "int2:g32:asym:recip", "int2:g16:sym:rule=signed:recip", "int8:g64:sym:recip",
              "int4:g32:asym:rot=had:recip", "mxfp4", "nvfp4", "nf4", "iq4nl", "int4:g32:asym", "int2:g32:asym",
              "int4:g32:asym:rot=had", "int8:g32:sym:rnd=away", "int2:g16:sym:rnd=up", "freetoken:q4_0",
              "fp4_e2m1:g32:s=f16", "fp4_e2m1:g16:s=e4m3:ts:rot=had", "int3:g32:asym", "int3:g16:sym:rot=had",
              "int5:g32:sym:rnd=up:recip", "int6:g16:asym", "lm3:g64", "lm3:g32:rot=had", "lm2:g64:rot=had", "lm4:g64",
              "kivi4", "kivi2", "int2:g16:chan:sym", "int4:g16:chan:sym:rule=signed", "lm2:g16:chan", "nf4:g32:chan"]


def _edge_case(spec, dtype):
    """(x, slots, layout, pages, static kwargs): `edge_input` of `spec` in `dtype` on one head of 64, stored from the
    second page on."""
    x = edge_input(spec).to(dtype).to(DEV)
    T, P = x.shape[0], page_size_for(spec)
    lay, n_pages = PageLayout(spec, 64, P, 1), -(-T // P) + 1
    s, ts = calibrate(x.float(), spec)
    kw = {k: v for k, v in (("scale", s), ("tensor_scale", ts)) if v is not None}
    return x, torch.arange(T, device=DEV) + P, lay, n_pages, kw


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("name", FLAT_SPECS, ids=[spec_id(n) for n in FLAT_SPECS])
def test_group_row_path(name, dtype, monkeypatch):
    """Single-plane token-row specs with reciprocal int codes or codebooks take the group-row path
    (`_store_rows`, FLAT): with edge values in every input dtype (16-bit inputs find GGML's signed
    extreme through one max over sort keys) its bytes equal the oracle's and the general tile path's."""
    from kvlab.kernels.store.triton import kernel_params
    spec = spec_of(name)
    assert kernel_params(dataclasses.replace(spec, rotation="none"), 64)["FLAT"], name
    x, slots, lay, n_pages, kw = _edge_case(spec, dtype)
    ref, _ = run_store(x, slots, lay, n_pages, spec, "reference", **kw)
    tri, _ = run_store(x, slots, lay, n_pages, spec, "triton", **kw)
    _nan_aware_equal(ref, tri, f"{name} {dtype}", spec)
    from kvlab.kernels.store import triton as st
    monkeypatch.setattr(st, "kernel_params", lambda sp, D, flat=True: kernel_params(sp, D, False))
    gen, _ = run_store(x, slots, lay, n_pages, spec, "triton", **kw)
    _nan_aware_equal(gen, tri, f"{name} {dtype}: general vs group-row path")


def test_group_row_path_selection():
    """FLAT for token rows of int (reciprocal, or IEEE division as Markstein's two FMAs on the group's reciprocal)
    and codebook specs in one plane or two sequentially packed planes (3, 5, 6 bits; Lloyd-Max rms specs too), for channel-axis groups of one plane (KIVI keys: channels as the group rows); not for fp8,
    GGML-packed bit planes, three planes, float storage, channel-axis bit planes."""
    from kvlab.kernels.store.triton import kernel_params
    names = ["q4_0", "q8_0", "fp8_e4m3", "mxfp4", "int4:g32:asym", "freetoken:q4_0", "int3:g32:asym", "bf16",
             "int4:g32:chan:asym", "lm3:g64", "lm2:g64", "int5:g32:sym", "int6:g32:asym", "int7:g32:asym",
             "int3:g32:asym:pack=ggml", "q5_0", "int3:g32:chan:asym", "kivi2"]
    flat = {n: kernel_params(spec_of(n), 128)["FLAT"] for n in names}
    assert flat == {"q4_0": True, "q8_0": True, "fp8_e4m3": False, "mxfp4": True, "int4:g32:asym": True,
                    "freetoken:q4_0": True, "int3:g32:asym": True, "bf16": False, "int4:g32:chan:asym": True,
                    "int3:g32:chan:asym": False, "kivi2": True,
                    "lm3:g64": True, "lm2:g64": True, "int5:g32:sym": True, "int6:g32:asym": True,
                    "int7:g32:asym": False, "int3:g32:asym:pack=ggml": False, "q5_0": False}


SIGNED_ZERO_SPECS = ["q4_1", "q4_0", "q8_0", "iq4nl", "int2:g16:sym:rule=signed:recip", "int2:g32:asym:recip",
                     "int4:g32:asym", "int8:g32:asym:rnd=away:recip", "int4:g32:sym:rnd=away:recip", "kivi4"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("name", SIGNED_ZERO_SPECS, ids=[spec_id(n) for n in SIGNED_ZERO_SPECS])
def test_signed_zeros_and_overflowing_reciprocals(name, dtype):
    """Groups of mixed +-0 (GGML keeps the first element equal to a zero extreme, sign included; the
    signed extreme of an all-zero group is its first zero) and groups so small that the reciprocal of
    the scale overflows (the oracle saturates +-inf to +-FLT_MAX before rounding). T = 11 with one
    skipped slot, so the kernel also sees a partial block."""
    spec = spec_of(name)
    pz, nz = 0.0, -0.0
    rows = [[nz, pz] * 32, [pz, nz] * 32, [nz] * 64, [nz, 1.0, 2.0, pz] * 16, [pz, -1.0, nz, -2.0] * 16,
            [1e-38, -1e-38, 0.0, 5e-39] * 16, [-3e-39, 2e-38, nz, 1e-38] * 16, [nz, -5.0, 5.0, pz] * 16]
    g = torch.Generator().manual_seed(3)
    x = torch.cat([torch.tensor(rows)[:, None, :], torch.randn(3, 1, 64, generator=g)]).to(dtype)
    G = spec.group
    if spec.axis == "chan":  # channel groups run along tokens: put the special rows down the columns
        x = torch.cat([x[:G].transpose(0, 2).reshape(G, 1, 64) if x.shape[0] >= G else
                       torch.cat([x, x.flip(0)] * 4)[:G]])
    x = x.to(DEV)
    T, P = x.shape[0], (max(16, G) if spec.axis == "chan" else 16)
    lay, n_pages = PageLayout(spec, 64, P, 1), -(-T // P) + 1
    slots = torch.arange(T, device=DEV) + P
    if spec.axis != "chan":
        slots[T - 2] = -1
    ref, _ = run_store(x, slots, lay, n_pages, spec, "reference")
    tri, _ = run_store(x, slots, lay, n_pages, spec, "triton")
    _nan_aware_equal(ref, tri, f"{name} {dtype}", spec)


def _near_half_groups(n: int, G: int, bits: int, seed: int) -> torch.Tensor:
    """[n, G] float32 groups whose quotients x / s fall within a few ulps of half-integers: element 0 is 0 and
    element 1 is QMAX * s0 (an fp16 scale, so the stored asym scale is s0 and the zero 0), the rest
    nextafter-steps around (k + 0.5) * s0, where x * (1 / s) and the IEEE x / s round to different codes."""
    g = torch.Generator().manual_seed(seed)
    qmax = 2 ** bits - 1
    s0 = (torch.rand(n, 1, generator=g) * 4 + 0.01).half().float()
    k = torch.randint(0, qmax, (n, G), generator=g).float() + 0.5
    x = k * s0
    for _ in range(3):
        step = torch.randint(-1, 2, (n, G), generator=g).float()
        x = torch.where(step > 0, torch.nextafter(x, torch.full_like(x, 1e30)),
                        torch.where(step < 0, torch.nextafter(x, torch.full_like(x, -1e30)), x))
    x[:, 0], x[:, 1] = 0.0, qmax * s0[:, 0]
    return x


@pytest.mark.parametrize("name", ["int4:g32:asym", "int4:g32:asym:rnd=away", "int4:g32:asym:rnd=up", "int2:g32:asym",
                                  "int8:g32:asym", "kivi4", "int4:g32:asym:s=f32"],
                         ids=lambda n: spec_id(n))
def test_division_by_reciprocal_exact(name):
    """IEEE-division int specs code x * (1 / s) and fall back to the division for tiles with a quotient near a
    rounding boundary: quotients a few ulps off half-integers (where the two differ) give the oracle's codes."""
    spec = spec_of(name)
    G, D = spec.group, 64
    chan = spec.axis == "chan"
    grp = _near_half_groups(D if chan else 2 * D // G * 2, G, spec.bits, zlib.crc32(name.encode()) % 1000)
    s0 = grp[:, 1:2] / (2 ** spec.bits - 1)
    assert (torch.round(grp * (1 / s0)) != torch.round(grp / s0)).any(), "the input must separate the two"
    x = grp.T.reshape(G, 1, D) if chan else grp.reshape(-1, 1, D)
    T, P = x.shape[0], 32
    lay, n_pages = PageLayout(spec, D, P, 1), -(-T // P) + 1
    slots = torch.arange(T, device=DEV) + P
    ref, _ = run_store(x.to(DEV), slots, lay, n_pages, spec, "reference")
    tri, _ = run_store(x.to(DEV), slots, lay, n_pages, spec, "triton")
    assert_same_pages(ref, tri, name)


def test_quotient_safe_only_for_f16_scales_without_a_tensor_scale():
    """The int specs whose division can skip the rare fallback and its check (`store.triton.quotient_safe`): IEEE
    division by an f16 scale with no tensor scale; not GGML's reciprocal, bf16 / f32 scales, calibrated levels,
    codebooks."""
    from kvlab.kernels.store.triton import kernel_params, quotient_safe
    safe = {n: quotient_safe(kernel_params(spec_of(n), 64)) for n in (
        "int2:g32:asym", "int4:g32:asym", "int3:g32:asym", "int4:g32:asym:rot=had", "int4:g32:chan:asym",
        "int8:g32:sym", "q4_0", "q4_1", "int4:g32:asym:s=bf16", "int4:g32:asym:s=f32", "int4:g32:sym:s=e4m3:ts",
        "int2:g32:chan:asym:cal", "nf4", "fp8_e4m3")}
    assert [n for n, v in safe.items() if v] == ["int2:g32:asym", "int4:g32:asym", "int3:g32:asym",
                                                 "int4:g32:asym:rot=had", "int4:g32:chan:asym", "int8:g32:sym"], safe


@pytest.mark.parametrize("name", ["int2:g32:asym", "int4:g32:asym", "int3:g32:asym", "int4:g32:asym:rot=had",
                                  "kivi4", "int8:g32:sym"], ids=lambda n: spec_id(n))
def test_f16_scales_at_their_extremes_need_no_fallback(name):
    """Specs that compile no rare division fallback (`quotient_safe`) store the oracle's bytes for groups whose f16
    scale is subnormal (down to 2^-24), rounds to 0, sits near 65504 or overflows to inf: float32 inputs from
    1e-12 to 1e6 times a random group, both signs."""
    spec = spec_of(name)
    G, D = spec.group, 64
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()) % 1000)
    mags = torch.tensor([1e-12, 1e-9, 3e-8, 1e-7, 6e-6, 1e-3, 1.0, 3e3, 6e4, 5e5, 9.8e5, 1e6])
    n = G if spec.axis == "chan" else 2 * len(mags)
    x = torch.randn(n, 1, D, generator=g)
    if spec.axis == "chan":  # a magnitude a channel group (tokens run down the group)
        x = x * mags[torch.arange(D) % len(mags)][None, None, :]
    else:
        x = x * mags.repeat(2)[:, None, None]
    T, P = x.shape[0], 32
    lay, n_pages = PageLayout(spec, D, P, 1), -(-T // P) + 1
    slots = torch.arange(T, device=DEV) + P
    ref, _ = run_store(x.to(DEV), slots, lay, n_pages, spec, "reference")
    tri, _ = run_store(x.to(DEV), slots, lay, n_pages, spec, "triton")
    _nan_aware_equal(ref, tri, name, spec)


def _codebook_safe(monkeypatch, request, on: bool) -> None:
    """Set `CODEBOOK_SAFE` (read by `kernel_params`, whose cache is cleared now and after the test) and the row walk's
    `CODEBOOK_SAFE_WALK` both."""
    import kvlab.kernels.store.triton as st
    import kvlab.kernels.store.triton_row_walk as rw
    monkeypatch.setattr(st, "CODEBOOK_SAFE", on)
    monkeypatch.setattr(rw, "CODEBOOK_SAFE_WALK", on)
    st.kernel_params.cache_clear()
    request.addfinalizer(st.kernel_params.cache_clear)


def test_codebook_safe_only_for_f16_scales_bounding_their_group(monkeypatch, request):
    """The sorted-codebook specs whose rare groups are coded in closed form (`store.triton.codebook_safe`, with
    CODEBOOK_SAFE on): f16 scales from the group's statistics; not bf16 / e4m3 / e8m0 scales, a tensor scale, static or
    unit scales, fp4."""
    from kvlab.kernels.store.triton import codebook_safe, kernel_params
    _codebook_safe(monkeypatch, request, True)
    safe = {n: codebook_safe(kernel_params(spec_of(n), 64)) for n in (
        "nf4", "iq4nl", "iq4nl:g32:rule=signed", "lm2:g64", "lm4:g64:rot=had", "lm3:g32:rot=had", "nf4:s=bf16",
        "nf4:g32:s=e4m3", "nf4:tensor", "mxfp4", "nvfp4", "int4:g32:asym", "int2:g32:chan:asym:cal")}
    assert [n for n, v in safe.items() if v] == ["nf4", "iq4nl", "iq4nl:g32:rule=signed", "lm2:g64",
                                                 "lm4:g64:rot=had", "lm3:g32:rot=had"], safe


def test_row_walk_keeps_the_codebook_check_unless_asked(monkeypatch, request):
    """The closed form is on by default for the group-row kernel (`CODEBOOK_SAFE`), and the row walk takes it only with
    its own switch (`walk_safe`: SAFE 2 becomes 0), so lm2-lm4 keep their check and fixup pass; ints keep SAFE 1."""
    import kvlab.kernels.store.triton as st
    import kvlab.kernels.store.triton_row_walk as rw
    monkeypatch.setattr(st, "CODEBOOK_SAFE", True)
    st.kernel_params.cache_clear()
    request.addfinalizer(st.kernel_params.cache_clear)
    for on, want in ((False, 0), (True, 2)):
        monkeypatch.setattr(rw, "CODEBOOK_SAFE_WALK", on)
        for name in ("lm2:g64", "lm4:g64:rot=had"):
            p = st.kernel_params(spec_of(name), 64)
            assert p["SAFE"] == 2 and rw.walk_safe(p) == want, (name, on)
        assert rw.walk_safe(st.kernel_params(spec_of("int3:g32:asym"), 64)) == 1


@pytest.mark.parametrize("closed", [False, True], ids=["fallback", "closed_form"])
@pytest.mark.parametrize("name", ["nf4", "iq4nl", "iq4nl:g32:rule=signed", "lm2:g64", "lm4:g64:rot=had",
                                  "lm3:g32:rot=had"], ids=lambda n: spec_id(n))
def test_codebook_groups_with_zero_nan_or_infinite_scales(name, closed, monkeypatch, request):
    """Sorted codebooks with f16 scales code the groups whose scale is 0 (all-zero or tiny groups), NaN (a NaN or inf
    element) or inf (an f16 overflow) by the rare exact fallback, or in closed form with CODEBOOK_SAFE
    (`_odd_scale_codes`): the oracle's bytes for such groups beside ordinary ones, float32 inputs."""
    import kvlab.kernels.store.triton as st
    _codebook_safe(monkeypatch, request, closed)
    spec = spec_of(name)
    assert st.codebook_safe(st.kernel_params(spec, 64)) == closed
    G, D = spec.group, 64
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()) % 1000)
    x = torch.randn(12, 1, D, generator=g)
    x[1] = 0.0  # every scale 0
    x[2] *= 1e-30  # scales that round to 0 in f16
    x[3, 0, 5] = float("nan")  # its group's scale NaN
    x[4, 0, 9] = float("inf")
    x[5] *= 1e6  # absmax / level past 65504: scales overflow to inf
    x[6, 0, :G] *= 3e5  # one group overflowing, the others not
    x[7, 0, :] = -0.0
    lay, P = None, 16
    T = x.shape[0]
    lay, n_pages = PageLayout(spec, D, P, 1), -(-T // P) + 1
    slots = torch.arange(T, device=DEV) + P
    ref, _ = run_store(x.to(DEV), slots, lay, n_pages, spec, "reference")
    tri, _ = run_store(x.to(DEV), slots, lay, n_pages, spec, "triton")
    _nan_aware_equal(ref, tri, name, spec)


@pytest.mark.parametrize("ts", [1.0, 1e-6, 1e-36], ids=["ts1", "saturated", "subnormal"])
def test_e2m1_bracket_exact(ts):
    """fp4 e2m1 codes by bracketing |x| between two scaled magnitudes equal the 16-entry search: midpoints and
    ties, zero groups, an e4m3 scale saturated far below the group's range (|x| > 12 s: the search's fallback),
    and subnormal effective scales."""
    g = torch.Generator().manual_seed(3)
    mags = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    mid = torch.cat([mags, (mags[1:] + mags[:-1]) / 2])  # every value and every midpoint of e2m1
    x = (mid[torch.randint(0, 15, (16, 1, 64), generator=g)] * torch.where(torch.rand(16, 1, 64, generator=g) < 0.5,
                                                                            -1.0, 1.0)) * 0.75
    x[0, 0, 16:32] = 0.0
    x[1, 0] = torch.randn(64, generator=g) * 3
    for name in ["nvfp4", "mxfp4", "fp4_e2m1:g32:s=f16"]:
        spec = spec_of(name)
        lay, n_pages = PageLayout(spec, 64, 16, 1), 2
        slots = torch.arange(16, device=DEV)
        kw = {"tensor_scale": torch.tensor([ts])} if spec.tensor_scale else {}
        ref, _ = run_store(x.to(DEV), slots, lay, n_pages, spec, "reference", **kw)
        tri, _ = run_store(x.to(DEV), slots, lay, n_pages, spec, "triton", **kw)
        assert_same_pages(ref, tri, f"{name} ts={ts}")


SORTED_CB = ["nf4", "iq4nl", "nf4:g32:s=e4m3", "lm2:g64", "lm3:g64", "lm4:g32", "lm3:g64:rot=had"]


@pytest.mark.parametrize("name", SORTED_CB)
def test_sorted_codebook_bracket_exact(name, monkeypatch):
    """Codes of an ascending codebook by binary search over the scaled levels equal the 16-entry search: values on
    every level and every midpoint with an exact power-of-two scale (the two neighbours' errors tie: the lower index
    wins), negative scales (iq4nl's signed rule), zero groups; and, in their own call (one odd group sends its whole
    tile to the search), a NaN element, an outlier far past the range, tiny (subnormal-product) scales. On the
    interpreter the ordinary groups are also stored with the fallback switched off: the fast path alone is exact."""
    import kvlab.kernels.store.triton as st
    from kvlab.quant.formats import CODEBOOKS
    spec = spec_of(name)
    cb = torch.tensor(CODEBOOKS[spec.fmt])
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()) % 1000)
    pts = torch.cat([cb, (cb[1:] + cb[:-1]) / 2]) / cb.abs().max()
    D, T = 64, 24
    x = pts[torch.randint(0, len(pts), (T, 1, D), generator=g)]
    x[:, 0, 0] = 1.0  # the largest level: absmax scales are exact powers of two below
    x *= 2.0 ** torch.randint(-3, 4, (T, 1, 1), generator=g).float()
    x[0] = -x[0]
    x[1, 0, :32] = 0.0
    x[2:6] = torch.randn(4, 1, D, generator=g) * torch.exp(torch.randn(4, 1, 1, generator=g))
    x[4, 0, 9] = 60.0  # a spike: ~sqrt(G) RMS, past twice the largest Lloyd-Max level, within the bracket's 32 times
    odd = torch.randn(4, 1, D, generator=g)
    odd[0, 0, 5] = float("nan")
    odd[1, 0, 7] = 1e30
    odd[2] *= 1e-38
    lay = PageLayout(spec, D, 16, 1)
    for data, n_pages in ((x, 3), (odd, 2)):
        slots = torch.arange(data.shape[0], device=DEV)
        ref, _ = run_store(data.to(DEV), slots, lay, n_pages, spec, "reference")
        tri, _ = run_store(data.to(DEV), slots, lay, n_pages, spec, "triton")
        assert_same_pages(ref, tri, name)
    assert st.kernel_params(spec, D)["CBS"] == len(CODEBOOKS[spec.fmt])
    if DEV == "cpu":  # the interpreter reads the global at run time
        monkeypatch.setattr(st, "RARE_PATHS", False)
        y = x[2:]  # without the zero groups of row 1 (a zero scale is the fallback's)
        slots = torch.arange(T - 2, device=DEV)
        ref, _ = run_store(y.to(DEV), slots, lay, 3, spec, "reference")
        tri, _ = run_store(y.to(DEV), slots, lay, 3, spec, "triton")
        assert_same_pages(ref, tri, name + " without the fallback")



PK_SPECS = ["int2:g32:asym", "int3:g32:asym", "lm2:g64", "lm4:g32", "nf4", "nvfp4", "int4:g16:sym:rule=signed",
            "int6:g16:asym"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", PK_SPECS, ids=[spec_id(n) for n in PK_SPECS])
def test_packed_word_loads(name, dtype):
    """Sequentially packed codes of 16-bit inputs load a byte's K elements as one word (PK): the oracle's bytes with
    edge values; and an input whose rows are not word-aligned (a view one element in) takes the element loads, with
    the same bytes."""
    from kvlab.kernels.store.triton import kernel_params, packed_loads
    spec = spec_of(name)
    x, slots, lay, n_pages, kw = _edge_case(spec, dtype)
    assert packed_loads(x, kernel_params(spec, 64))
    ref, _ = run_store(x, slots, lay, n_pages, spec, "reference", **kw)
    tri, _ = run_store(x, slots, lay, n_pages, spec, "triton", **kw)
    _nan_aware_equal(ref, tri, f"{name} {dtype} word loads", spec)
    wide = torch.zeros(x.shape[0], 1, 65, dtype=dtype, device=DEV)
    wide[:, :, 1:] = x
    odd = wide[:, :, 1:]  # unit element stride, rows 65 elements apart, base one element in: not word-aligned
    assert not packed_loads(odd, kernel_params(spec, 64))
    tri_odd, _ = run_store(odd, slots, lay, n_pages, spec, "triton", **kw)
    _nan_aware_equal(ref, tri_odd, f"{name} {dtype} element loads", spec)


@pytest.mark.parametrize("name", ["int4:g32:asym:s=f32", "int2:g16:asym:s=bf16"])  # (f16 scales never reach 2^-100)
def test_two_pass_fixup_rewrites_the_flagged_programs(name, monkeypatch):
    """Group-row division specs store writes of TWO_PASS_MIN_TOKENS or more in two launches (`two_pass`); fewer keep
    the fallback inline (a decode step's store is launch-bound). The main pass flags the programs holding a group
    whose scale is below 2^-100 (out of the exact quotient's range) and no others; the fixup pass recomputes those;
    every byte is the oracle's, as with the inline fallback (TWO_PASS off)."""
    import kvlab.kernels.store.triton as st
    monkeypatch.setattr(st, "TWO_PASS", True)  # (off by default: slower on the H200, runs/s17-adcc53c)
    monkeypatch.setattr(st, "TWO_PASS_MIN_TOKENS", 1)  # (small writes keep the fallback inline)
    spec = spec_of(name)
    G, D = spec.group, 64
    assert st.two_pass(st.kernel_params(spec, D))
    grp = _near_half_groups(2 * D // G * 2, G, spec.bits, 11)
    grp[::3] *= 2.0 ** -110  # every third group's scale below 2^-100: its reciprocal is out of the quotient's range
    x = grp.reshape(-1, 1, D).to(DEV)
    T, P = x.shape[0], 32
    lay, n_pages = PageLayout(spec, D, P, 1), -(-T // P) + 1
    slots = torch.arange(T, device=DEV) + P
    ref, _ = run_store(x, slots, lay, n_pages, spec, "reference")
    modes, flags = [], []
    kernel = st._store_kernel

    class Launch:  # records each launch's pass and the main pass's flags; drops the fixup when asked
        skip_fixup = False

        def __getitem__(self, grid):
            def go(*a, **k):
                modes.append(k["TWO"])
                if not (Launch.skip_fixup and k["TWO"] == 2):
                    kernel[grid](*a, **k)
                if k["TWO"] == 1:
                    flags.append(a[8].clone())  # (x, codes, scales, zeros, slots, static, ts, lut, flags, ...)
            return go
    monkeypatch.setattr(st, "_store_kernel", Launch())
    Launch.skip_fixup = True
    main_only, _ = run_store(x, slots, lay, n_pages, spec, "triton")
    assert modes == [1, 2] and torch.equal(main_only["scales"], ref["scales"])
    assert int((flags[0] != 0).sum()) > 0  # a program holding an out-of-range scale is flagged
    # (the fast codes are Markstein's exact quotients, so even unfixed they are the oracle's here)
    assert_same_pages(ref, main_only, name + " main pass")
    Launch.skip_fixup = False
    both, _ = run_store(x, slots, lay, n_pages, spec, "triton")
    assert_same_pages(ref, both, name)
    flags.clear()
    run_store((x * 2.0 ** 110).where(x.abs() < 1e-20, x), slots, lay, n_pages, spec, "triton")  # every scale in range
    assert int((flags[0] != 0).sum()) == 0
    for two, min_tokens in ((False, 1), (True, T + 1)):  # switched off; a write below the size bound
        monkeypatch.setattr(st, "TWO_PASS", two)
        monkeypatch.setattr(st, "TWO_PASS_MIN_TOKENS", min_tokens)
        modes.clear()
        inline, _ = run_store(x, slots, lay, n_pages, spec, "triton")
        assert modes == [0]
        assert_same_pages(ref, inline, f"{name} inline (TWO_PASS {two}, min tokens {min_tokens})")


TWO_PASS_SPECS = ["int4:g32:asym:s=bf16", "int3:g32:asym:s=f32", "int4:g32:chan:asym:s=bf16", "nf4", "iq4nl", "lm2:g64", "lm3:g64:rot=had", "mxfp4",
                  "nvfp4", "int2:g16:asym:s=f32"]


@pytest.mark.parametrize("name", TWO_PASS_SPECS, ids=[spec_id(n) for n in TWO_PASS_SPECS])
def test_two_pass_store_is_the_oracle(name, monkeypatch, request):
    """Every family the two-pass store takes (division ints, bit planes, channel-axis keys, sorted codebooks, fp4,
    rotations; ints with bf16 or f32 scales: f16 ones need no fallback, `quotient_safe`; sorted codebooks with their
    closed form off, `codebook_safe`), with small writes forced through it: the oracle's bytes on random rows with
    zero, huge, NaN and subnormal groups."""
    import kvlab.kernels.store.triton as st
    _codebook_safe(monkeypatch, request, False)
    monkeypatch.setattr(st, "TWO_PASS", True)
    monkeypatch.setattr(st, "TWO_PASS_MIN_TOKENS", 1)
    spec = spec_of(name)
    assert st.two_pass(st.kernel_params(spec, 64))
    x, slots, lay, n_pages, kw = make_input(spec, T=40, seed=21)
    x[1, 0, :] = 0.0
    x[2, 1, 3] = float("nan")
    x[3, 0, :16] *= 1e30
    x[4, 1, :] *= 1e-40
    ref, _ = run_store(x, slots, lay, n_pages, spec, "reference", **kw)
    tri, _ = run_store(x, slots, lay, n_pages, spec, "triton", **kw)
    assert_same_pages(ref, tri, name)
    if spec.axis != "chan":  # a fixed one-row tile: the flags cover its grid, the largest one
        tri1, _ = run_store(x, slots, lay, n_pages, spec, "triton", config={"block_r": 1, "num_warps": 1}, **kw)
        assert_same_pages(ref, tri1, name + " block_r 1")


CHAN_VARIANTS = [("CHAN_T",), ("CHAN_J",), ("CHAN_J", "CHAN_HEADS"), ("CHAN_HEADS",), ("CHAN_T", "CHAN_HEADS"),
                 ("CHAN_J", "RARE_RELOAD")]


@pytest.mark.skipif(DEV != "cpu", reason="a GPU reads the kernel's constexpr globals when it compiles (Triton refuses "
                    "a changed one); benchmarks/store_variants.py gates each variant there in its own process")
@pytest.mark.parametrize("variant", CHAN_VARIANTS, ids=["+".join(v) for v in CHAN_VARIANTS])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("name", ["kivi4", "kivi2", "int4:g32:chan:sym", "nf4:g32:chan"])
def test_channel_row_variants_store_the_oracles_bytes(name, dtype, variant, monkeypatch):
    """The channel-axis load variants, each off by default until timed on a GPU, store the oracle's bytes: the
    [G tokens, channels] tile loaded whole and turned (`store.triton.CHAN_T`), element tiles loaded as [bytes,
    channels] and turned (`CHAN_J`), rows over (head, channel) so a program may span heads (`CHAN_HEADS`), and
    `CHAN_J` with the exact fallback a tile at a time (RARE_RELOAD 2, every tile sent through it). Edge values on one
    head, then random values on three heads with an odd group count (a program's rows cross heads and the last one is
    partial)."""
    from kvlab.kernels.store import triton as st
    spec = spec_of(name)
    assert st.kernel_params(spec, 64)["FLAT"], name
    for flag in variant:
        monkeypatch.setattr(st, flag, tl.constexpr(2 if flag == "RARE_RELOAD" else True))
    if "RARE_RELOAD" in variant:  # every tile through the tile-wise fallback (random and edge inputs rarely reach it)
        monkeypatch.setattr(st, "_odd", _always_odd)
    x, slots, lay, n_pages, kw = _edge_case(spec, dtype)
    ref, _ = run_store(x, slots, lay, n_pages, spec, "reference", **kw)
    got, _ = run_store(x, slots, lay, n_pages, spec, "triton", **kw)
    _nan_aware_equal(ref, got, f"{name} {dtype} ({'+'.join(variant)}), edge values", spec)
    x, slots, lay, n_pages, kw = make_input(spec, T=3 * spec.group, Hk=3, D=64, seed=11, dtype=dtype)
    ref, _ = run_store(x, slots, lay, n_pages, spec, "reference", **kw)
    got, _ = run_store(x, slots, lay, n_pages, spec, "triton", config=StoreConfig(block_r=128, num_warps=4), **kw)
    _nan_aware_equal(ref, got, f"{name} {dtype} ({'+'.join(variant)}), three heads", spec)


@pytest.mark.skipif(DEV != "cpu", reason="a GPU reads the kernel's constexpr globals when it compiles (Triton refuses "
                    "a changed one); benchmarks/store_variants.py gates each variant there in its own process")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("name", ["int4_had", "int4:g32:asym:rot=had:recip", "lm2:g64:rot=had", "lm4:g64:rot=had"])
def test_rotation_by_the_oracles_stages_stores_the_oracles_bytes(name, dtype, monkeypatch):
    """The store's other Hadamard stages (`store.triton.FWHT_IN_PLACE` False: the oracle's split / join / transpose;
    the default in-place pair exchange is what every other rotated-spec test runs) store the oracle's bytes for
    rotated specs, edge values included (both orders of the stages are checked bit for bit in
    tests/kernels/tiles/test_rotate.py)."""
    from kvlab.kernels.store import triton as st
    spec = spec_of(name)
    x, slots, lay, n_pages, kw = _edge_case(spec, dtype)
    ref, _ = run_store(x, slots, lay, n_pages, spec, "reference", **kw)
    monkeypatch.setattr(st, "FWHT_IN_PLACE", tl.constexpr(False))
    got, _ = run_store(x, slots, lay, n_pages, spec, "triton", **kw)
    _nan_aware_equal(ref, got, f"{name} {dtype} (the oracle's stages)", spec)


@triton.jit
def _always_odd(x, s_raw, s_val, m_raw, m_val, s_eff, cb_ptr, FMT: tl.constexpr, SYM: tl.constexpr,
                RECIP: tl.constexpr, OFF: tl.constexpr, CBS: tl.constexpr, BOUND: tl.constexpr = False):
    """`store.triton._odd` that always holds (per group): every tile takes the exact fallback."""
    return ((s_val == s_val) | (s_val != s_val)).to(tl.int32)


RELOAD_SPECS = ["int4:g32:asym", "int3:g32:asym", "int2:g32:asym", "int8:g32:asym", "kivi4", "nf4", "iq4nl:g32:rule=signed", "mxfp4", "nvfp4", "int4_had"]


@pytest.mark.skipif(DEV != "cpu", reason="a GPU reads the kernel's constexpr globals when it compiles (Triton refuses "
                    "a changed one); benchmarks/store_variants.py gates each variant there in its own process")
@pytest.mark.parametrize("reload", [0, 1, 2])
@pytest.mark.parametrize("name", RELOAD_SPECS, ids=[spec_id(n) for n in RELOAD_SPECS])
def test_rare_fallback_stores_the_oracles_bytes_however_it_gets_its_inputs(name, reload, monkeypatch):
    """Every tile forced through the inline exact fallback (its rare check patched to always hold) stores the
    oracle's bytes with the fallback's inputs kept live (`RARE_RELOAD` 0), loaded again (1, the default) or loaded and
    coded one element tile at a time (2); rotated specs always keep theirs. Edge values, bf16."""
    from kvlab.kernels.store import triton as st
    spec = spec_of(name)
    p = st.kernel_params(spec, 64)
    assert p["FLAT"] and st.RARE_PATHS and ((p["FMT"] == 0 and not p["RECIP"]) or (p["FMT"] == 3 and p["CBS"] >= 1))
    x, slots, lay, n_pages, kw = _edge_case(spec, torch.bfloat16)
    ref, _ = run_store(x, slots, lay, n_pages, spec, "reference", **kw)
    monkeypatch.setattr(st, "_odd", _always_odd)
    monkeypatch.setattr(st, "RARE_RELOAD", tl.constexpr(reload))
    got, _ = run_store(x, slots, lay, n_pages, spec, "triton", **kw)
    _nan_aware_equal(ref, got, f"{name} (every tile by the fallback, RARE_RELOAD {reload})", spec)


def test_unknown_switch_names_the_allowed_ones():
    """`store.triton.set_switches` (benchmarks and offline tools set the kernels' compile-time switches by name) refuses
    a name that is not one, and a module global that is not a switch, naming the switches."""
    from kvlab.kernels.store import triton as st
    for bad in ("CHAN_X", "AUTOTUNE_KEY"):
        with pytest.raises(ValueError, match=f"unknown store switch '{bad}'; allowed: .*CHAN_J.*FWHT_IN_PLACE"):
            st.set_switches(**{bad: True})
