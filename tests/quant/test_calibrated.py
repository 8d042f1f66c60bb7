"""Calibrated codebooks (`lm2..lm4:cal`, `int2..int4:cal`): the spec option, the weighted Lloyd fit, the oracle's codebook= contract,
the pool's table beside the pages (set or fitted from the first tokens), the Gluon table words, and calibration in
the decode-faithful evaluation."""
from __future__ import annotations

import pytest
import torch

import kvlab
from kvlab.cache.paging import codebook_table
from kvlab.quant import dequantize, fake_quantize, fit_codebook, quantize
from kvlab.quant.formats import codebook


def _heavy(seed=0, shape=(2, 96, 64)):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) ** 3


def _wmse(x, spec, levels, w=None):
    """Weighted squared error of the cache's copy of x, in the spec's (rotated) domain where the fit measures it."""
    from kvlab.quant import rotate
    y = fake_quantize(x, spec, codebook=levels) if spec.calibrated else fake_quantize(x, spec)
    a, b = (rotate(y), rotate(x)) if spec.rotation == "had" else (y, x)
    return float(((a - b) ** 2 * (1 if w is None else w)).sum())


def test_spec_option_round_trips_and_is_checked():
    s = kvlab.parse_spec("lm3:g64:rot=had:cal")
    assert s.calibrated and s.needs_codebook and str(s) == "lm3:g64:rot=had:cal"
    assert kvlab.KVQuantSpec.from_dict(s.to_dict()) == s and s.bits_per_element_at(64) == kvlab.parse_spec("lm3").bits_per_element_at(64)
    sch = kvlab.scheme("k=int4:g32:chan:asym,v=lm3:cal,L1=lm4:rot=had:cal|lm2:cal")
    assert kvlab.scheme(str(sch)) == sch
    for bad in ("int5:cal", "int8:g32:cal", "nf4:cal", "fp8:cal", "fp4:cal"):
        with pytest.raises(ValueError, match="cal .* applies to the Lloyd-Max formats .* and to ints of 2..4 bits"):
            kvlab.parse_spec(bad)
    for bad, what in (("int4:twos:cal", "twos"), ("int4:recip:cal", "recip"), ("int3:g32:asym:rnd=away:cal", "rounding away"),
                      ("int4:g32:rule=mse:cal", "rule mse")):
        with pytest.raises(ValueError, match=f"calibrated int .*{what} describes uniform codes"):
            kvlab.parse_spec(bad)


@pytest.mark.parametrize("text", ["lm2:g32:cal", "lm3:g64:rot=had:cal", "lm4:g32:cal", "lm3:g16:chan:cal"])
def test_fit_lowers_the_error_it_minimises(text):
    """Lloyd's iterations from the Lloyd-Max levels never raise the weighted squared error on the sample (each step
    is optimal given the other): the fitted levels beat the fixed ones on heavy-tailed data, clearly."""
    spec = kvlab.parse_spec(text)
    x = _heavy()
    lv = fit_codebook(x, spec)
    assert lv.shape == (2 ** spec.bits,) and bool((lv[1:] > lv[:-1]).all())
    fixed = codebook(spec.fmt)
    assert _wmse(x, spec, lv) < 0.97 * _wmse(x, spec, fixed)
    assert torch.equal(lv, fit_codebook(x, spec))  # deterministic


def test_fit_weights_move_levels_toward_weighted_channels():
    spec = kvlab.parse_spec("lm2:g64:cal")
    x = _heavy(1)
    w = torch.ones(64)
    w[:8] = 100.0  # channels the queries stress
    lw = fit_codebook(x, spec, w)
    assert _wmse(x, spec, lw, w) <= _wmse(x, spec, fit_codebook(x, spec), w) * (1 + 1e-6)
    with pytest.raises(ValueError, match="non-negative"):
        fit_codebook(x, spec, -w)
    with pytest.raises(ValueError, match="fits a calibrated spec"):
        fit_codebook(x, kvlab.parse_spec("lm3"))
    with pytest.raises(ValueError, match="no usable calibration values"):
        fit_codebook(torch.zeros(1, 8, 64), spec)


def test_oracle_needs_a_valid_table():
    spec = kvlab.parse_spec("lm3:g32:cal")
    x = _heavy(2, (40, 64))
    lv = fit_codebook(x, spec)
    q = quantize(x, spec, codebook=lv)
    assert torch.equal(dequantize(q), fake_quantize(x, spec, codebook=lv))
    assert torch.equal(fake_quantize(x, spec, codebook=codebook_table(lv)), fake_quantize(x, spec, codebook=lv))
    with pytest.raises(ValueError, match="pass its levels"):
        quantize(x, spec)
    with pytest.raises(ValueError, match="not calibrated"):
        quantize(x, kvlab.parse_spec("lm3:g32"), codebook=lv)
    for bad, msg in ((lv[:5], "must be 8 finite"), (lv.flip(0), "strictly ascending"),
                     (torch.full((8,), float("nan")), "must be 8 finite")):
        with pytest.raises(ValueError, match=msg):
            quantize(x, spec, codebook=bad)
    q.codebook = None
    with pytest.raises(ValueError, match="pass its levels"):
        dequantize(q)


def test_pool_keeps_the_table_beside_its_pages():
    """A set table is what the pages hold and what readers use; an unset one is fitted from the first tokens
    appended; a table for a spec that is not calibrated, or after the first append, is refused."""
    from kvlab.cache.pool import KVPool
    sch = kvlab.scheme("k=lm3:g32:rot=had:cal,v=lm2:g32:cal")
    x = _heavy(3, (50, 2, 64))
    lk = fit_codebook(x.transpose(0, 1), sch.k)
    pool = KVPool(sch, n_layers=2, n_kv_heads=2, head_dim=64, n_pages=8, page_size=16)
    pool.set_static_scales(0, k_codebook=lk)
    with pytest.raises(ValueError, match="takes no codebook"):
        KVPool(kvlab.scheme("lm3"), n_layers=1, n_kv_heads=2, head_dim=64, n_pages=4).set_static_scales(
            0, k_codebook=lk)
    s = pool.add_sequence()
    for layer in range(2):
        pool.append(s, layer, x, x * 0.5)
    assert torch.equal(pool.k_pages[0]["codebook"], codebook_table(lk))
    for layer in range(2):  # layer 1 and every V table: fitted from the first tokens, unweighted
        assert bool(torch.isfinite(pool.v_pages[layer]["codebook"]).all())
    assert torch.equal(pool.v_pages[1]["codebook"][:4], fit_codebook((x * 0.5).transpose(0, 1), sch.v))
    k, v = pool.dense_kv(s, 0)
    assert torch.allclose(k, fake_quantize(x.transpose(0, 1), sch.k, codebook=lk), atol=1e-5)
    with pytest.raises(ValueError, match="already holds tokens"):
        pool.set_static_scales(0, k_codebook=lk)


def test_gluon_table_words_on_device_equal_the_host_words():
    from kvlab.kernels.decode.gluon import table_words_of
    from kvlab.kernels.decode.gluon_codecs import cb_table_words
    t = codebook_table(fit_codebook(_heavy(4), kvlab.parse_spec("lm3:g64:cal")))
    want = [w - (1 << 32) if w >= 1 << 31 else w for w in cb_table_words(t.tolist())]
    assert table_words_of(t).tolist() == want


def test_faithful_calibration_fits_tables_on_other_text(tiny_llama):
    """calibrate() gives each calibrated layer tensor a table (keys weighted by their queries); the backend refuses
    to score a calibrated scheme without one."""
    from kvlab.eval.faithful import DecodeFaithfulBackend, calibrate
    model = tiny_llama()
    sch = kvlab.scheme("k=lm3:g32:rot=had:cal,v=lm2:g32:cal")
    toks = torch.randint(0, model.config.vocab_size, (1, 64), generator=torch.Generator().manual_seed(0))
    cal = calibrate(model, toks, sch)
    assert set(cal) == set(range(model.config.n_layers))
    for layer in cal.values():
        assert layer["k"]["codebook"].shape == (8,) and layer["v"]["codebook"].shape == (4,)
    with pytest.raises(ValueError, match="calib=calibrate"):
        DecodeFaithfulBackend(sch, model.config.n_layers)
    out = model(toks, backend=DecodeFaithfulBackend(sch, model.config.n_layers, cal))
    assert torch.isfinite(out).all()


def test_roundtrip_fits_calibrated_levels_on_other_data():
    """The sweep's round trip: a calibrated spec's levels come from another sample (seed + 1), never the scored
    one; without other data it is an error."""
    from kvlab.eval.distributions import sample
    from kvlab.eval.roundtrip import roundtrip, roundtrip_scheme
    spec = kvlab.parse_spec("lm3:g64:cal")
    r = roundtrip_scheme("lm3:cal", "student_t4", n=512, d=64, seed=3)
    x, other = sample("student_t4", 512, 64, 3, "cpu"), sample("student_t4", 512, 64, 4, "cpu")
    assert r["k_rel_l2"] == pytest.approx(roundtrip(x, spec, other)["rel_l2"], rel=1e-6)
    assert r["k_rel_l2"] < roundtrip_scheme("lm3", "student_t4", n=512, d=64, seed=3)["k_rel_l2"]
    with pytest.raises(ValueError, match="give calib_x"):
        roundtrip(x, spec)


# ---- calibrated ints (`int2..int4:cal`): levels in the int's code units, its scale and zero kept ----------------
CAL_INTS = ["int2:g32:chan:asym:cal", "int3:g32:asym:cal", "int4:g32:cal", "int4:g16:rule=signed:cal",
            "int2:g64:asym:rot=had:cal", "int4:head:asym:cal"]


@pytest.mark.parametrize("text", CAL_INTS)
def test_calibrated_int_is_the_int_with_other_levels(text):
    """With the integers as its table a calibrated int stores the plain int's scales and zeros, and its values are
    the int's up to the rare half-step ties (the nearest level keeps the lower, rounding keeps the even); fitted
    levels keep the int's two end levels exactly, move the others and cut the weighted squared error on heavy-tailed
    data (Lloyd's steps from the integers never raise it), and the oracle's packed round trip is exact."""
    from kvlab.quant.formats import uniform_levels
    spec = kvlab.parse_spec(text)
    plain = kvlab.parse_spec(text.replace(":cal", ""))
    x = _heavy(5, (2, 64, 64))
    uni = uniform_levels(spec)
    qc, qp = quantize(x, spec, codebook=uni), quantize(x, plain)
    assert torch.equal(qc.scales, qp.scales) and (qp.zeros is None or torch.equal(qc.zeros, qp.zeros))
    same = fake_quantize(x, spec, codebook=uni) == fake_quantize(x, plain)
    assert float(same.float().mean()) > 0.999
    lv = fit_codebook(x, spec)
    assert lv.shape == (2 ** spec.bits,) and bool((lv[1:] > lv[:-1]).all())
    assert float(lv[0]) == float(uni[0]) and float(lv[-1]) == float(uni[-1])  # the ends kept
    assert float((lv[1:-1] - uni[1:-1]).abs().max()) > 0.01  # the others moved
    assert _wmse(x, spec, lv) < _wmse(x, plain, None)
    q = quantize(x, spec, codebook=lv)
    assert torch.equal(dequantize(q), fake_quantize(x, spec, codebook=lv))


def test_calibrated_int_codes_are_the_nearest_level():
    """Every stored value is the level nearest to x - zero in the scale's units (ties: the lower code), so no other
    level of the table would have been closer; a non-finite group dequantizes to NaN (the oracle's contract)."""
    spec = kvlab.parse_spec("int2:g32:asym:cal")
    x = _heavy(6, (8, 64))
    lv = torch.tensor([0.2, 1.1, 1.9, 2.8])
    q = quantize(x, spec, codebook=lv)
    s = q.scales.float().repeat_interleave(32, -1)
    z = q.zeros.float().repeat_interleave(32, -1)
    cand = s[..., None] * lv + z[..., None]                       # [8, 64, 4] every level's value
    got = fake_quantize(x, spec, codebook=lv)
    err = (cand - x[..., None]).abs()
    assert bool(((got - x).abs() <= err.min(-1).values * (1 + 1e-6) + 1e-6).all())
    x[3, 5] = float("nan")
    y = fake_quantize(x, spec, codebook=lv)
    assert bool(y[3, :32].isnan().all()) and bool(torch.isfinite(y[3, 32:]).all())


def test_pool_fits_and_keeps_calibrated_int_levels():
    """A calibrated int pair in the pool: levels fitted from the first tokens (or set), decode through the Triton
    path equals attention over the oracle's values."""
    from kvlab.cache.pool import KVPool
    sch = kvlab.scheme("k=int2:g32:chan:asym:cal,v=int3:g32:asym:cal")
    x = _heavy(7, (64, 2, 64))
    pool = KVPool(sch, n_layers=1, n_kv_heads=2, head_dim=64, n_pages=8, page_size=32)
    s = pool.add_sequence()
    pool.append(s, 0, x, x * 0.5)
    lk = pool.k_pages[0]["codebook"][:4]
    assert bool(torch.isfinite(lk).all()) and torch.equal(lk, fit_codebook(x.transpose(0, 1), sch.k))
    k, v = pool.dense_kv(s, 0)
    assert torch.allclose(k, fake_quantize(x.transpose(0, 1), sch.k, codebook=lk), atol=1e-5)
    assert torch.allclose(v, fake_quantize((x * 0.5).transpose(0, 1), sch.v,
                                           codebook=pool.v_pages[0]["codebook"][:8]), atol=1e-5)


def test_conformance_vectors_carry_calibrated_levels(tmp_path):
    """Every calibrated role's cases name their levels (fitted on a synthetic sample of their own), the bytes
    re-encode with them, and the layout says what a code means."""
    from kvlab.export.conformance import check_conformance, kvlab_encode_fn, read_vectors, write_vectors
    sch = kvlab.scheme("k=int2:g32:chan:asym:cal,v=lm3:g64:rot=had:cal,L1=int3:g32:asym:cal|lm2:g64")
    meta = write_vectors(str(tmp_path), sch, head_dim=64, rows=64)
    tensors, _ = read_vectors(str(tmp_path))
    for c in meta["cases"]:
        cal = kvlab.parse_spec(c["spec"]).calibrated
        assert ("codebook" in c) == cal
        if cal:
            assert tensors[f"{c['role']}.{c['case']}.codebook"].tolist() == pytest.approx(c["codebook"])
    assert "calibrated levels" in meta["k_layout"]["codes"] and "rounding" not in meta["k_layout"]
    assert check_conformance(str(tmp_path), kvlab_encode_fn)["ok"]
