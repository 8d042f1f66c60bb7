"""Triton decode == float32 reference over the dequantized paged cache (interpreter on CPU)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import kvlab
from kvlab.kernels.decode import decode
from paged_cases import call_args, make_paged

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = 2e-2 if DEV == "cuda" else 1e-4  # bf16 dots on GPU; fp32 (ieee) dots in the interpreter

# (B, lens, Hq, Hk, D, P, scheme, fp_lens, splits)
CASES = [
    *[(2, [17, 40], 8, 2, 64, P, s, None, None) for s, P in
      (("q4_0", 16), ("q4_1", 16), ("q8_0", 16), ("fp8_e4m3", 16), ("mxfp4", 16), ("nvfp4", 16), ("int4_had", 16),
       ("int3:g32:asym", 16), ("int2:g32:asym", 16), ("bf16", 16), ("nf4", 16), ("q5_0", 16), ("iq4nl", 16),
       ("fp8_e5m2", 16), ("int4:g32:s=e8m0", 16), ("int6:g16", 16), ("int4:head:asym", 16), ("lm4", 16),
       ("lm3:g32:rot=had", 16))],
    (2, [32, 64], 8, 2, 64, 32, "k=lm2:g32:chan,v=lm2", [5, 31], None),
    (2, [17, 40], 8, 2, 64, 16, "k=lm3:g64:rot=had:cal,v=lm4:g32:cal", [3, 0], None),  # calibrated tables
    (2, [32, 64], 8, 2, 64, 32, "k=int2:g32:chan:asym:cal,v=int3:g32:asym:cal", [5, 31], 2),  # calibrated ints
    (1, [50], 4, 1, 128, 16, "k=int4:g32:cal,v=int2:g64:asym:rot=had:cal", None, 3),
    (2, [17, 40], 6, 2, 64, 16, "k=lm2:g64:s=e4m3:rot=had:smooth,v=lm2:g64:s=e4m3:rot=had", [3, 0], None),  # smoothing
    (2, [17, 40], 6, 2, 64, 16, "k=int3:g16:asym:smooth:perm,v=int3:g32:asym", [3, 0], 2),  # smoothing + channel order
    (2, [32, 64], 8, 2, 64, 32, "kivi4", [5, 31], None),
    # outlier slots: token- and channel-axis keys, a rotated V, a codebook (slots over every kind of tile)
    (2, [17, 40], 8, 2, 64, 16, "k=int3:g32:asym:out=2,v=int2:g32:asym:out=1", [3, 0], 2),
    (2, [32, 64], 8, 2, 64, 32, "k=int2:g32:chan:asym:out=1,v=lm3:g64:rot=had:out=3", [5, 31], None),
    (1, [50], 4, 1, 128, 16, "nf4:out=4", None, 3),
    (2, [64, 96], 8, 2, 64, 64, "kivi2", [0, 7], 3),
    (3, [1, 17, 63], 8, 2, 64, 16, "q4_0", [1, 0, 4], 3),
    (2, [1, 63], 2, 2, 64, 1, "q8_0", None, 4),
    (2, [17, 63], 16, 2, 64, 64, "q4_1", None, 2),
    (2, [17, 63], 4, 4, 128, 16, "q4_0", [3, 2], 2),
    (2, [17, 63], 8, 1, 128, 16, "fp8_e4m3", None, None),
    (1, [64], 8, 2, 128, 32, "kivi4", [17], 2),
    (1, [1000], 8, 2, 64, 16, "q4_0", [9], None),
    (1, [992], 4, 1, 64, 32, "kivi4", [8], 5),
    (2, [0, 17], 8, 2, 64, 16, "int4_had", [3, 0], 2),
    # GGML-packed planes whose order differs from the main plane's (qh bits picked in registers):
    # one unit per group (q5_0, q5_1), two (g64) and a 2+1-bit split
    *[(2, [17, 40], 8, 2, 64, 16, s, None, None) for s in
      ("q5_1", "int5:g64:sym:pack=ggml", "int3:g32:asym:pack=ggml", "int7:g32:asym:pack=ggml")],
    (1, [50], 4, 1, 128, 16, "int6:g32:sym:pack=ggml", [3], 2),
]


def _id(c):
    B, lens, Hq, Hk, D, P, s, fp, S = c
    return f"B{B}-L{max(lens)}-Hq{Hq}-Hk{Hk}-D{D}-P{P}-{s}" + (f"-S{S}" if S else "") + ("-fp" if fp else "")


def _run(c, **kw):
    B, lens, Hq, Hk, D, P, name, fp, S = c
    sch = kvlab.scheme(name)
    cache = make_paged(lens, Hk, D, P, sch.k, sch.v, fp_lens=fp, seed=hash(_id(c)) % 1000, device=DEV)
    q = torch.randn(B, Hq, D, generator=torch.Generator().manual_seed(7)).to(DEV)
    args, kwa = call_args(cache)
    ref = decode(q, *args, sch.k, sch.v, P, **kwa, backend="reference")
    out = torch.full_like(q, float("nan"))
    got = decode(q, *args, sch.k, sch.v, P, **kwa, num_splits=S, out=out, **kw)
    return ref, got


@pytest.mark.parametrize("c", CASES, ids=[_id(c) for c in CASES])
def test_decode_matches_reference(c):
    ref, got = _run(c)
    assert not torch.isnan(got).any(), "unwritten or NaN output elements"
    err = (got.float() - ref.float()).abs().max().item() / ref.abs().max().clamp_min(1e-6).item()
    assert err < TOL, f"relative error {err:.2e}"


@pytest.mark.parametrize("dot", ["fp16", pytest.param("bf16", marks=pytest.mark.skipif(
    DEV == "cpu", reason="the interpreter multiplies bf16 dot operands as raw bits"))])
def test_decode_low_precision_dots(dot):
    ref, got = _run(CASES[0], config={"dot": dot})
    err = (got.float() - ref.float()).abs().max().item() / ref.abs().max().item()
    assert err < 2e-2


FMA_CASES = [c for c in CASES if c[6] in ("q4_0", "q8_0", "kivi4", "nvfp4", "q5_0", "bf16", "int4_had")][:9]


@pytest.mark.parametrize("c", FMA_CASES, ids=[_id(c) for c in FMA_CASES])
@pytest.mark.parametrize("bn", [16, 32])
def test_decode_fma_path(c, bn):
    """dot="fma": CUDA-core products and reductions instead of tl.dot (group left unpadded)."""
    ref, got = _run(c, config={"dot": "fma", "block_n": bn, "num_warps": 4, "num_stages": 2, "asm": False})
    assert not torch.isnan(got).any()
    err = (got.float() - ref.float()).abs().max().item() / ref.abs().max().clamp_min(1e-6).item()
    assert err < 1e-4, f"relative error {err:.2e}"   # fp32 FMAs on the GPU too


@pytest.mark.parametrize("c", FMA_CASES, ids=[_id(c) for c in FMA_CASES])
def test_decode_kv_major_orientation(c):
    """orient="kv": scores^T = K q^T and out^T += V^T p^T (same attention)."""
    ref, got = _run(c, config={"orient": "kv", "block_n": 32, "num_warps": 4, "num_stages": 2})
    assert not torch.isnan(got).any()
    err = (got.float() - ref.float()).abs().max().item() / ref.abs().max().clamp_min(1e-6).item()
    assert err < TOL, f"relative error {err:.2e}"


def test_decode_rejects_bad_orientation():
    with pytest.raises(ValueError, match="orient='x'"):
        _run(CASES[0], config={"orient": "x"})
    with pytest.raises(ValueError, match="does not combine"):
        _run(CASES[0], config={"orient": "kv", "dot": "fma"})


def test_decode_rejects_unknown_dot_mode():
    with pytest.raises(ValueError, match="dot='tf32'"):
        _run(CASES[0], config={"dot": "tf32"})


@pytest.mark.skipif(DEV == "cpu", reason="the fp16 fast paths (inline PTX) run on the GPU only")
@pytest.mark.parametrize("name", ["q4_0", "q4_1", "int4_had", "q8_0", "int8:g32:asym", "int8:g32", "fp8_e4m3",
                                  "fp8_e5m2"])
def test_fast_paths_match_plain(name):
    """GPU: the fp16 fast paths (config asm=True) agree with the plain-Triton path and the reference."""
    c = (2, [17, 300], 32, 8, 128, 16, name, None, 3)
    ref, plain = _run(c, config={"asm": False})
    _, fast = _run(c, config={"asm": True})
    scale = ref.abs().max().item()
    assert (fast.float() - ref.float()).abs().max().item() / scale < TOL
    assert (fast.float() - plain.float()).abs().max().item() / scale < 1e-2


def test_reference_matches_oracle_attention():
    """The reference's page gathering equals attention over kvlab.dequantize(kvlab.quantize(x))."""
    torch.manual_seed(0)
    spec = kvlab.scheme("q4_1").k
    x_k, x_v = torch.randn(2, 33, 64), torch.randn(2, 33, 64)
    qk, qv = kvlab.quantize(x_k, spec), kvlab.quantize(x_v, spec)
    P, ids = 16, torch.tensor([2, 0, 1], dtype=torch.int32)
    from kvlab.cache.layout import PageLayout
    lay = PageLayout(spec, 64, P, 2)
    pages = []
    for qt in (qk, qv):
        pg = lay.allocate(3)
        codes = torch.cat([qt.codes, qt.codes[:, :15]], 1)  # pad to 48 tokens
        for key, t in (("codes", codes), ("scales", torch.cat([qt.scales, qt.scales[:, :15]], 1)),
                       ("zeros", torch.cat([qt.zeros, qt.zeros[:, :15]], 1))):
            pg[key][ids.long()] = t.reshape(2, 3, P, *t.shape[2:]).reshape(2, 3, *lay.code_shape(1)[2:] if
                                                                        key == "codes" else lay.scale_shape(1)[2:]).transpose(0, 1)
        pages.append(pg)
    q = torch.randn(1, 4, 64)
    out = decode(q, pages[0], pages[1], torch.tensor([0, 3]), ids, torch.tensor([1]), spec, spec, P,
                 backend="reference")
    k, v = kvlab.dequantize(qk), kvlab.dequantize(qv)
    s = torch.einsum("hd,hld->hl", q[0], k.repeat_interleave(2, 0)) / 8
    want = torch.einsum("hl,hld->hd", s.softmax(-1), v.repeat_interleave(2, 0))
    torch.testing.assert_close(out[0], want, rtol=1e-5, atol=1e-5)


def _bad_case():
    sch = kvlab.scheme("q4_0")
    c = make_paged([17, 5], 2, 64, 16, sch.k, sch.v)
    args, kw = call_args(c)
    return sch, torch.randn(2, 8, 64), list(args), kw


@pytest.mark.parametrize("what,match", [
    ("hq", "multiple of Hk"), ("rank", "3-d"), ("dtype", "q dtype"), ("indptr", "kv_indptr"),
    ("pages", "k_pages\\['codes'\\] has shape"), ("mismatch", "pages but v_pages"), ("spec", "zeros"),
    ("backend", "backend"), ("fp", "together"), ("splits", "num_splits"), ("prerope", "reference"),
    ("headdim", "head_dim 96"), ("nvfp4_ts", "tensor_scale"), ("max_kv_len", "max_kv_len"),
])
def test_decode_rejects_bad_input(what, match):
    sch, q, args, kw = _bad_case()
    k_spec, v_spec, extra = sch.k, sch.v, {}
    if what == "hq":
        q = torch.randn(2, 7, 64)
    elif what == "rank":
        q = q[0]
    elif what == "dtype":
        q = q.to(torch.int32)
    elif what == "indptr":
        args[2] = args[2][:-1]
    elif what == "pages":
        args[0] = {**args[0], "codes": args[0]["codes"][:, :, :, :8]}
    elif what == "mismatch":
        args[1] = {k: (v[:-1] if v is not None else None) for k, v in args[1].items()}
    elif what == "spec":
        k_spec = kvlab.scheme("q4_1").k
    elif what == "backend":
        extra = {"backend": "cuda"}
    elif what == "fp":
        kw = {**kw, "k_fp": torch.zeros(2, 2, 4, 64)}
    elif what == "splits":
        extra = {"num_splits": 0}
    elif what == "max_kv_len":
        extra = {"max_kv_len": 0}
    elif what == "prerope":
        k_spec = dataclasses.replace(sch.k, pre_rope=True)
    elif what == "headdim":
        q = torch.randn(2, 8, 96)
        sch = kvlab.scheme("int8:g32")
        c = make_paged([17, 5], 2, 96, 16, sch.k, sch.v)
        a, kw = call_args(c)
        args, k_spec, v_spec = list(a), sch.k, sch.v
    elif what == "nvfp4_ts":
        sch = kvlab.scheme("nvfp4")
        c = make_paged([17, 5], 2, 64, 16, sch.k, sch.v)
        a, kw = call_args(c)
        args, k_spec, v_spec, kw = list(a), sch.k, sch.v, {**kw, "k_tensor_scale": None}
    with pytest.raises(ValueError, match=match):
        decode(q, *args, k_spec, v_spec, 16, **kw, **extra)


def test_max_kv_len_caps_the_splits_not_the_tokens(monkeypatch):
    """A bound on the sequences' tokens caps the split count at the tiles it fills (an explicit num_splits wins);
    a sequence longer than the bound is still attended whole."""
    from kvlab.kernels.checks import check_prefix
    from kvlab.kernels.decode import api as dapi
    monkeypatch.setattr(dapi, "auto_splits", lambda *a, **k: 9)
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # (the interpreter on the CPU)
    sch = kvlab.scheme("q4_0")
    c = make_paged([200, 17], 2, 64, 16, sch.k, sch.v, seed=3, device=dev)
    args, kw = call_args(c)
    q = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(1)).to(dev)
    kv = check_prefix(q, *args, sch.k, sch.v, 16, kw["k_fp"], kw["v_fp"], kw["fp_len"], kw["k_tensor_scale"],
                      kw["v_tensor_scale"], 2)
    tile = dapi.tile_tokens(dapi.resolve(q, kv)[1])  # 64 on the CPU (Triton's default), the Gluon tile on a GPU
    bounds = (None, 1, tile, tile + 1, 3 * tile, 10 ** 6)
    splits = [dapi.resolve(q, kv, None, None, m)[1].num_splits for m in bounds]
    assert splits == [9, 1, 1, 2, 3, 9]
    assert dapi.resolve(q, kv, None, 5, 64)[1].num_splits == 5
    seen = []  # decode hands its bound to the dispatch (the split count the backend runs with)
    resolve = dapi.resolve
    monkeypatch.setattr(dapi, "resolve", lambda *a: seen.append(resolve(*a)[1].num_splits) or resolve(*a))
    decode(q, *args, sch.k, sch.v, 16, **kw, max_kv_len=tile)
    decode(q, *args, sch.k, sch.v, 16, **kw)
    assert seen == [1, 9]
    monkeypatch.setattr(dapi, "resolve", resolve)
    ref = decode(q, *args, sch.k, sch.v, 16, **kw, backend="reference")
    got = decode(q, *args, sch.k, sch.v, 16, **kw, max_kv_len=tile)  # one split over 200 tokens
    err = (got.float() - ref.float()).abs().max().item() / ref.abs().max().clamp_min(1e-6).item()
    assert err < TOL, f"relative error {err:.2e}"


def test_max_kv_len_counts_the_triton_tile_of_channel_groups(monkeypatch):
    """The Triton kernel widens its tile to a channel-axis spec's token group: the cap counts that tile, so 256 tokens
    of groups of 128 take 2 splits, not 4 of block_n 64 (two of which would be empty)."""
    from kvlab.kernels.checks import check_prefix
    from kvlab.kernels.configs import TritonDecodeConfig
    from kvlab.kernels.decode import api as dapi
    monkeypatch.setattr(dapi, "auto_splits", lambda *a, **k: 9)
    sch = kvlab.scheme("k=int4:g128:chan:asym,v=q4_0")
    c = make_paged([256], 2, 64, 128, sch.k, sch.v, seed=4)
    args, kw = call_args(c)
    q = torch.randn(1, 8, 64)
    kv = check_prefix(q, *args, sch.k, sch.v, 128, kw["k_fp"], kw["v_fp"], kw["fp_len"], kw["k_tensor_scale"],
                      kw["v_tensor_scale"], 1)
    assert dapi.tile_tokens(TritonDecodeConfig(), kv) == 128 and dapi.tile_tokens(TritonDecodeConfig()) == 64
    assert dapi.resolve(q, kv, TritonDecodeConfig(), None, 256)[1].num_splits == 2


def test_head_dim_96_runs_on_reference():
    sch = kvlab.scheme("q8_0")
    c = make_paged([17, 5], 2, 96, 16, sch.k, sch.v)
    args, kw = call_args(c)
    out = decode(torch.randn(2, 8, 96), *args, sch.k, sch.v, 16, **kw, backend="reference")
    assert out.shape == (2, 8, 96) and torch.isfinite(out).all()


def test_decode_plan_relaunches_on_updated_q():
    c = CASES[6]  # int4_had: rotation applied inside the planned call
    B, lens, Hq, Hk, D, P, name, fp, S = c
    sch = kvlab.scheme(name)
    cache = make_paged(lens, Hk, D, P, sch.k, sch.v, fp_lens=[2, 3], device=DEV)
    args, kw = call_args(cache)
    q = torch.randn(B, Hq, D, device=DEV)
    run = decode(q, *args, sch.k, sch.v, P, **kw, num_splits=2, plan=True)
    run()
    q.copy_(torch.randn(B, Hq, D))
    got = run()
    ref = decode(q, *args, sch.k, sch.v, P, **kw, backend="reference")
    assert (got - ref).abs().max() / ref.abs().max() < TOL


@pytest.mark.parametrize("cfg", [{"block_n": 32, "num_warps": 4, "num_stages": 2},
                                 {"block_n": 64, "num_warps": 8, "num_stages": 2, "maxnreg": 128},
                                 {"block_n": 128, "num_warps": 8, "num_stages": 2}], ids=["bn32", "bn64w8r128", "bn128w8"])
@pytest.mark.parametrize("name", ["q4_0", "q8_0", "fp8_e4m3"])
def test_decode_tile_configs(name, cfg):
    """Tile shapes the tuner tries (and a register cap, ignored by the interpreter) stay correct."""
    c = (2, [17, 200], 8, 2, 128, 16, name, None, 3)
    ref, got = _run(c, config=cfg)
    assert not torch.isnan(got).any()
    err = (got.float() - ref.float()).abs().max().item() / ref.abs().max().clamp_min(1e-6).item()
    assert err < TOL, f"relative error {err:.2e}"


ROWFIRST = {"layout": "rowfirst", "block_n": 32, "num_warps": 4, "num_stages": 2}
ROWFIRST_CASES = [
    *[(2, [17, 40], 8, 2, 64, 16, s, None, None) for s in
      ("q8_0", "fp8_e4m3", "q4_0", "q4_1", "int4_had", "int8:g32:asym", "int2:g32:asym", "int3:g32:asym", "mxfp4",
       "nvfp4", "bf16")],
    (3, [1, 17, 63], 8, 2, 64, 16, "q4_0", [1, 0, 4], 3),
    (2, [1, 63], 2, 2, 64, 1, "q8_0", None, 4),
    (2, [17, 63], 16, 2, 64, 64, "q4_1", None, 2),
    (2, [17, 63], 8, 1, 128, 16, "fp8_e4m3", None, None),
    (1, [1000], 8, 2, 64, 16, "q4_0", [9], None),
    (2, [0, 17], 8, 2, 64, 16, "int4_had", [3, 0], 2),
    (1, [64], 8, 2, 128, 32, "kivi4", [17], 2),
]


@pytest.mark.parametrize("c", ROWFIRST_CASES, ids=[_id(c) for c in ROWFIRST_CASES])
def test_decode_rowfirst_matches_reference(c):
    """config layout 'rowfirst' (dequantize in the load's row layout, pinned there on the GPU) == reference;
    outputs start NaN-poisoned, odd lengths, page sizes 1/16/32/64, fp tokens."""
    ref, got = _run(c, config=ROWFIRST)
    assert not torch.isnan(got).any(), "unwritten or NaN output elements"
    err = (got.float() - ref.float()).abs().max().item() / ref.abs().max().clamp_min(1e-6).item()
    assert err < TOL, f"relative error {err:.2e}"


def test_rowfirst_rejects_unknown_layout():
    with pytest.raises(ValueError, match="layout"):
        _run(CASES[0], config={"layout": "colfirst"})


@pytest.mark.skipif(DEV == "cpu", reason="the fp16 fast paths (inline PTX) run on the GPU only")
@pytest.mark.parametrize("name", ["q4_0", "q4_1", "int4_had", "q8_0", "int8:g32:asym", "int8:g32", "fp8_e4m3",
                                  "fp8_e5m2", "int2:g32:asym", "nvfp4"])
@pytest.mark.parametrize("bn", [64, 128])
def test_rowfirst_fast_matches_operand_layout(name, bn):
    """GPU: rowfirst (asm fast paths + pin) agrees with the operand-layout path and the reference."""
    c = (2, [17, 300], 32, 8, 128, 16, name, None, 3)
    cfg = {"block_n": bn, "num_warps": 4, "num_stages": 2, "asm": True}
    ref, old = _run(c, config=cfg)
    _, new = _run(c, config={**cfg, "layout": "rowfirst"})
    scale = ref.abs().max().item()
    assert (new.float() - ref.float()).abs().max().item() / scale < TOL
    assert (new.float() - old.float()).abs().max().item() / scale < 1e-2


def test_tuner_offers_rowfirst_for_fast_path_specs():
    from kvlab.kernels import autotune
    for name, want in (("q4_0", True), ("q8_0", True), ("fp8_e4m3", True), ("int4_had", True), ("bf16", False),
                       ("int3:g32:asym", False), ("kivi4", True)):  # kivi4: V is per-token int4
        sch = kvlab.scheme(name)
        cands = autotune.triton_space(32, 8, sch.k, sch.v)
        assert any(c.layout == "rowfirst" for c in cands) == want, name


def test_last_dispatch_names_the_source(tmp_path, monkeypatch, caplog):
    """`last_dispatch()` says where the launched config came from: the user's tuned file, the closest batch bucket,
    the default, or an explicit config (with the split count set), and what was refused before it; logged at DEBUG."""
    import json
    import logging

    from kvlab.kernels import tuned
    from kvlab.kernels.checks import check_prefix
    from kvlab.kernels.configs import TritonDecodeConfig
    from kvlab.kernels.decode import api as dapi
    from kvlab.kernels.decode import last_dispatch
    from kvlab.kernels.tuned import attention_key
    monkeypatch.setenv("KVLAB_PACKAGED_CONFIGS", "0")
    monkeypatch.setattr(dapi, "_LOGGED", set())  # logged once per key and source in a process
    sch = kvlab.scheme("q4_0")
    c = make_paged([40, 17], 2, 64, 16, sch.k, sch.v, seed=5)
    args, kw = call_args(c)
    q = torch.randn(2, 8, 64)
    kv = check_prefix(q, *args, sch.k, sch.v, 16, kw["k_fp"], kw["v_fp"], kw["fp_len"], kw["k_tensor_scale"],
                      kw["v_tensor_scale"], 2)
    path = tmp_path / "tuned.json"
    try:
        tuned.set_cache_path(str(path))  # empty: the Triton default
        with caplog.at_level(logging.DEBUG, logger="kvlab.dispatch"):
            dapi.resolve(q, kv)
        d = last_dispatch()
        assert d["source"] == "triton default" and d["refused"] == [] and d["config"].num_splits >= 1
        assert d["key"] == attention_key("decode", sch.k, sch.v, 2, 8, 2, 64, 16)
        assert any("triton default" in r.getMessage() for r in caplog.records)
        mine = {"kernel": "triton", "version": 1, "block_n": 32, "num_warps": 2, "num_stages": 1, "num_splits": 3}
        key_b4 = attention_key("decode", sch.k, sch.v, 4, 8, 2, 64, 16)
        path.write_text(json.dumps({"format": 2, "configs": {key_b4: mine}}))
        tuned.set_cache_path(str(path))  # a B 4 entry: the B 2 call takes it from the closest bucket, splits re-derived
        dapi.resolve(q, kv)
        d = last_dispatch()
        assert d["source"] == "nearest batch bucket" and d["config"].block_n == 32
        path.write_text(json.dumps({"format": 2, "configs": {d["key"]: mine}}))
        tuned.set_cache_path(str(path))
        dapi.resolve(q, kv)
        d = last_dispatch()
        assert d["source"] == "tuned: user file" and (d["config"].block_n, d["config"].num_splits) == (32, 3)
        dapi.resolve(q, kv, TritonDecodeConfig(block_n=64), 5)
        d = last_dispatch()
        assert (d["source"], d["key"], d["config"].num_splits) == ("explicit config", None, 5)
    finally:
        tuned.set_cache_path(None)
    assert set(dapi.SOURCES) >= {"tuned: packaged", "gluon few-programs default", "gluon default"}
