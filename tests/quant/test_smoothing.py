"""Key smoothing (`smooth` K specs): the spec option, the calibrated factors, the oracle's smooth= contract, the
pool's factors beside the pages (keys stored divided, queries multiplied at the attention ops) and the Triton decode
and extend kernels through the pool (calibration in the evaluation: tests/eval/test_smoothing_calibration.py)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import kvlab
from kvlab.cache import KVPool
from kvlab.kernels.decode import decode
from kvlab.kernels.extend import extend
from kvlab.quant import dequantize, fake_quantize, fit_smoothing, quantize
from kvlab.quant.smoothing import check_smoothing

from pool_attend import attend, ops_args

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # the pool cases run where the kernels do (Gluon on a GPU)
TOL = 2e-2 if DEV == "cuda" else 1e-4  # bf16 window and dots on the GPU; fp32 in the interpreter


def _qk(seed=0, Hk=2, group=3, T=96, D=64):
    """Keys with a few large channels the queries barely use, and queries with channels keys barely fill: the
    imbalance smoothing removes (real keys have it: outlier channels, KVQuant)."""
    g = torch.Generator().manual_seed(seed)
    kscale = torch.ones(D)
    kscale[::9] = 12.0
    qscale = torch.ones(D)
    qscale[::9] = 0.1
    qscale[4::9] = 6.0
    kscale[4::9] = 0.2
    k = torch.randn(1, Hk, T, D, generator=g) * kscale
    q = torch.randn(1, Hk * group, T, D, generator=g) * qscale
    return q, k


def test_spec_option_round_trips_and_is_checked():
    s = kvlab.parse_spec("lm2:s=e4m3:rot=had:smooth")
    assert s.smooth and s.needs_smoothing and str(s) == "lm2:g64:s=e4m3:rot=had:smooth"
    assert kvlab.KVQuantSpec.from_dict(s.to_dict()) == s
    assert s.bits_per_element_at(64) == kvlab.parse_spec("lm2:s=e4m3:rot=had").bits_per_element_at(64)
    sch = kvlab.scheme("k=int3:g32:chan:asym:smooth,v=lm2,window=32,sink=4,L1=lm3:smooth|lm2")
    assert kvlab.scheme(str(sch)) == sch
    for bad, msg in (("bf16:smooth", "stores them as they are"), ("int4:prerope:smooth", "do not commute"),
                     ("int4:g32:smooth", "keys only"), ("k=q4_0,v=int4:g32:smooth", "keys only"),
                     ("k=q4_0,v=q4_0,L2=q4_0|int4:g32:smooth", "keys only")):
        with pytest.raises(ValueError, match=msg):
            kvlab.scheme(bad)


def test_fit_balances_keys_against_queries():
    """s_c^2 = rms(k_c) / rms(q_c) up to one constant per head: after smoothing, rms(k_c / s_c) * rms(q_c * s_c) is
    the same for every channel, and rms(k_c / s_c) / rms(q_c * s_c) too (the balance); geometric mean 1."""
    q, k = _qk()
    s = fit_smoothing(k, q)
    assert s.shape == (2, 64) and s.dtype == torch.float32
    assert torch.allclose(s.log2().mean(-1), torch.zeros(2), atol=1e-5)
    a = (k / s[None, :, None]).pow(2).mean((0, 2)).sqrt()
    b = (q.reshape(1, 2, 3, 96, 64) * s[None, :, None, None]).pow(2).mean((0, 2, 3)).sqrt()
    ratio = a / b
    assert torch.allclose(ratio, ratio[:, :1].expand_as(ratio), rtol=1e-4)
    assert s[0, 0] > 2 and s[0, 4] < 0.5  # large keys / small queries smoothed down, the converse up
    assert torch.equal(s, fit_smoothing(k, q))  # deterministic


def test_pair_tied_option_round_trips_and_is_checked():
    s = kvlab.parse_spec("lm2:s=e4m3:rot=had:smooth=pair")
    assert s.smooth and s.smooth_pairs and str(s) == "lm2:g64:s=e4m3:rot=had:smooth=pair"
    assert kvlab.KVQuantSpec.from_dict(s.to_dict()) == s
    assert kvlab.parse_spec("lm2:smooth=chan") == kvlab.parse_spec("lm2:smooth")
    sch = kvlab.scheme("k=lm2:s=e4m3:smooth=pair,v=lm2,L3=lm3:smooth=pair|lm2")
    assert kvlab.scheme(str(sch)) == sch
    for bad, msg in (("lm2:smooth=rope", "allowed: smooth .per channel., smooth=chan, smooth=pair"),
                     ("int4:prerope:smooth=pair", "do not commute"), ("bf16:smooth=pair", "as they are")):
        with pytest.raises(ValueError, match=msg):
            kvlab.parse_spec(bad)
    with pytest.raises(ValueError, match="needs smooth"):
        kvlab.KVQuantSpec(fmt="lm2", bits=2, group=64, rule="rms", smooth_pairs=True)


def _rope(x, pos, theta=10000.0):
    """x [B, H, T, D] rotated rotate-half style (pairs c, c + D/2) at positions pos [T]."""
    D = x.shape[-1]
    ang = pos[:, None].float() / theta ** (torch.arange(0, D, 2).float() / D)       # [T, D/2]
    cos, sin = ang.cos(), ang.sin()
    a, b = x[..., :D // 2], x[..., D // 2:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)


def test_pair_tied_factors_do_not_depend_on_positions():
    """`pairs=True`: one factor per RoPE pair from the pair's energy, so the same keys and queries rotated to other
    positions (as at 8K when calibrated on 512 tokens) give the same factors; per-channel factors do not. Both
    factors are tied (s_c == s_{c + D/2}) and balance the pairs' energies."""
    q, k = _qk(3, T=64)
    far = torch.arange(64) + 7000
    # the same rotation for keys and queries, every pair rotated (so each pair's energy is kept exactly)
    qr, kr = _rope(q, far), _rope(k, far)
    s0, s1 = fit_smoothing(k, q, pairs=True), fit_smoothing(kr, qr, pairs=True)
    assert torch.equal(s0[:, :32], s0[:, 32:])
    assert torch.allclose(s0, s1, rtol=1e-4)
    c0, c1 = fit_smoothing(k, q), fit_smoothing(kr, qr)
    assert (c0 / c1).log2().abs().max() > 0.5  # per channel: the balance moved with the rotation
    a = (k / s0[None, :, None]).pow(2).mean((0, 2))
    b = (q.reshape(1, 2, 3, 64, 64) * s0[None, :, None, None]).pow(2).mean((0, 2, 3))
    ea, eb = a[:, :32] + a[:, 32:], b[:, :32] + b[:, 32:]
    ratio = ea / eb
    assert torch.allclose(ratio, ratio[:, :1].expand_as(ratio), rtol=1e-4)
    with pytest.raises(ValueError, match="odd"):
        fit_smoothing(k[..., :63], q[..., :63], pairs=True)


def test_fit_searches_the_strength_per_head_against_the_score_error():
    """With the quantizing spec, each KV head takes the strength in ALPHAS whose quantized keys give the least
    centred score error on the calibration queries: never more error than no smoothing (alpha 0 is a candidate), and
    on keys whose large channels meet small queries some smoothing (alpha > 0)."""
    from kvlab.quant.smoothing import ALPHAS, fit_smoothing as fit
    spec = kvlab.parse_spec("lm2:g64:s=e4m3:rot=had")
    q, k = _qk(5, T=128)
    s = fit(k, q, spec=spec)
    lr = fit(k, q, alpha=1.0).log2()
    got = [(s[h].log2() / lr[h]).median().item() for h in range(2)]
    assert all(min(abs(g - a) for a in ALPHAS) < 1e-4 for g in got) and min(got) > 0

    def err(f):
        kh = fake_quantize(k / f[None, :, None], spec) * f[None, :, None]
        e = q.reshape(1, 2, -1, 64) @ (kh - k).transpose(-1, -2)
        return float((e - e.mean(-1, keepdim=True)).pow(2).sum())
    assert err(s) <= err(torch.ones(2, 64))
    assert torch.equal(fit(k, q, alpha=0.0), torch.ones(2, 64))
    with pytest.raises(ValueError, match="within \\[0, 1\\]"):
        fit(k, q, alpha=1.5)


def test_fit_leaves_out_sinks_and_checks_inputs():
    q, k = _qk()
    k2 = k.clone()
    k2[:, :, :2] *= 1000.0  # attention-sink outliers
    assert torch.equal(fit_smoothing(k2, q, sink=2), fit_smoothing(k, q, sink=2))
    assert not torch.allclose(fit_smoothing(k2, q), fit_smoothing(k, q))
    k3 = k.clone()
    k3[:, 0, :, 5] = 0.0  # a dead channel keeps factor 1
    assert fit_smoothing(k3, q)[0, 5] == 1.0
    with pytest.raises(ValueError, match=r"k must be a float tensor \[B, Hk, T, D\]"):
        fit_smoothing(k[0], q)
    with pytest.raises(ValueError, match="q must be"):
        fit_smoothing(k, q[:, :5])
    with pytest.raises(ValueError, match="past the 96 sinks"):
        fit_smoothing(k, q, sink=96)
    for bad, msg in ((torch.ones(2, 63), r"\[Hk=2, D=64\]"), (torch.zeros(2, 64), "finite and within"),
                     (torch.full((2, 64), float("inf")), "finite and within")):
        with pytest.raises(ValueError, match=msg):
            check_smoothing(bad, 2, 64)


def test_oracle_quantizes_the_smoothed_keys():
    spec = kvlab.parse_spec("int3:g32:sym:smooth")
    base = dataclasses.replace(spec, smooth=False)
    q, k = _qk(1)
    s = fit_smoothing(k, q)[:, None, :]                                   # [Hk, 1, D] against x [1, Hk, T, D]
    qt = quantize(k, spec, smooth=s)
    y = dequantize(qt)
    assert torch.equal(y, fake_quantize(k, spec, smooth=s))
    assert torch.equal(y, fake_quantize(k / s, base) * s)
    assert torch.equal(qt.codes, quantize(k / s, base).codes)
    with pytest.raises(ValueError, match="pass smooth="):
        quantize(k, spec)
    with pytest.raises(ValueError, match="does not smooth"):
        quantize(k, base, smooth=s)
    with pytest.raises(ValueError, match="do not broadcast"):
        quantize(k, spec, smooth=torch.ones(3, 64))
    with pytest.raises(ValueError, match="finite and positive"):
        quantize(k, spec, smooth=-s)


def test_smoothing_lowers_the_score_error_it_targets():
    """On keys whose large channels meet small queries, the scores of smoothed 2-bit keys are far closer to the
    exact ones than those of the same keys unsmoothed (the stored bits are the same)."""
    spec = kvlab.parse_spec("lm2:g64:s=e4m3:rot=had:smooth")
    base = dataclasses.replace(spec, smooth=False)
    q, k = _qk(2)
    s = fit_smoothing(k, q)
    qg = q.reshape(1, 2, 3 * 96, 64)
    exact = qg @ k.transpose(-1, -2)
    err = lambda kh: float((qg @ kh.transpose(-1, -2) - exact).pow(2).mean())  # noqa: E731
    assert err(fake_quantize(k, spec, smooth=s[:, None, :])) < 0.5 * err(fake_quantize(k, base))


def _pool_with(scheme, k, v, s, page=16, T0=60):
    Hk, D = k.shape[1], k.shape[2]
    k, v = k.to(DEV), v.to(DEV)
    pool = KVPool(scheme, 1, Hk, D, n_pages=16, page_size=page, device=DEV)
    if s is not None:
        pool.set_static_scales(0, k_smooth=s)
    sid = pool.add_sequence()
    pool.append(sid, 0, k[:T0], v[:T0])
    for t in range(T0, k.shape[0]):
        pool.append(sid, 0, k[t:t + 1], v[t:t + 1])
    return pool, sid


SCHEMES = ["k=lm2:g64:s=e4m3:rot=had:smooth,v=lm2:g64:s=e4m3:rot=had,window=8,sink=2",
           "k=int4:g32:sym:smooth,v=q4_0,window=4", "k=lm3:g32:cal:smooth,v=lm3:cal,sink=1"]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_pool_decode_and_extend_attend_the_model_keys(scheme, backend, monkeypatch):
    """The pool stores k / s (pages and window) with s beside the pages; `decode` and `extend` multiply q by s (and
    divide the chunk's keys): both equal exact attention over the pool's own view of the keys (`dense_kv`, k / s
    dequantized, times s), and that view is k up to the 2-4-bit error of k / s."""
    if backend == "triton":
        from kvlab.kernels.env import can_launch
        if not can_launch(torch.empty(0, device=DEV)):
            pytest.skip("the Triton kernels need a GPU or TRITON_INTERPRET=1")
    q, k4 = _qk(3, T=100)
    k, v = k4[0].transpose(0, 1).contiguous(), torch.randn(100, 2, 64, generator=torch.Generator().manual_seed(4))
    s = fit_smoothing(k4, q)
    pool, sid = _pool_with(scheme, k, v, s)
    k, v, s = k.to(DEV), v.to(DEV), s.to(DEV)
    assert torch.equal(pool.k_pages[0]["smooth"], s)
    kd, vd = pool.dense_kv(sid, 0)                                        # [Hk, T, D], model space
    fp = pool.fp_buffer(0, [sid])
    held = int(fp.length[0])
    if held:  # the window holds k / s (in the pool's fp dtype)
        pos = fp.positions[0, :held]
        assert torch.allclose(fp.k[0, :, :held].float() * s[:, None], k[pos].transpose(0, 1), rtol=TOL / 2)
    rel = (kd - k.transpose(0, 1)).norm() / k.norm()
    assert 0 < rel < 0.5
    args, kw = ops_args(pool, sid)

    def close(got, want):
        err = (got.double() - want).abs().max() / want.abs().max()
        assert err < TOL, f"relative error {err:.2e}"
    qd = torch.randn(1, 6, 64, generator=torch.Generator().manual_seed(5)).to(DEV)
    close(decode(qd, *args, **kw, backend=backend), attend(qd, kd, vd))
    kn, vn = torch.randn(2, 5, 2, 64, generator=torch.Generator().manual_seed(6)).to(DEV)
    qn = torch.randn(5, 6, 64, generator=torch.Generator().manual_seed(7)).to(DEV)
    got = extend(qn, kn, vn, torch.tensor([0, 5], device=DEV), *args, **kw, backend=backend)
    close(got, attend(qn, torch.cat([kd, kn.transpose(0, 1)], 1), torch.cat([vd, vn.transpose(0, 1)], 1)))


def test_decode_plan_reads_the_new_query_and_checks_the_factors():
    q, k4 = _qk(3, T=100)
    k, v = k4[0].transpose(0, 1).contiguous(), torch.randn(100, 2, 64)
    pool, sid = _pool_with(SCHEMES[1], k, v, fit_smoothing(k4, q))
    args, kw = ops_args(pool, sid)
    qd = torch.randn(1, 6, 64).to(DEV)
    run = decode(qd, *args, **kw, backend="reference", plan=True)
    first = run().clone()
    qd.mul_(-2.0)  # read in place on the next call, smoothed again
    assert torch.allclose(run(), decode(qd, *args, **kw, backend="reference"))
    assert not torch.allclose(run(), first)
    pages = dict(args[0])
    pages.pop("smooth")
    with pytest.raises(ValueError, match=r"k_pages\['smooth'\].*is required"):
        decode(qd, pages, *args[1:], **kw)
    pages["smooth"] = torch.zeros(2, 64, device=DEV)
    with pytest.raises(ValueError, match="finite and within"):
        decode(qd, pages, *args[1:], **kw)


def test_pool_factors_are_set_before_the_first_append_or_stay_one():
    scheme = SCHEMES[1]
    q, k4 = _qk(3, T=100)
    k, v = k4[0].transpose(0, 1).contiguous(), torch.randn(100, 2, 64)
    pool, sid = _pool_with(scheme, k, v, None)
    assert torch.equal(pool.k_pages[0]["smooth"].cpu(), torch.ones(2, 64))  # no queries seen: no smoothing
    with pytest.raises(ValueError, match="already holds tokens"):
        pool.set_static_scales(0, k_smooth=torch.ones(2, 64))
    p2 = KVPool("q4_0", 1, 2, 64, n_pages=4, page_size=16)
    with pytest.raises(ValueError, match="takes no smoothing factors"):
        p2.set_static_scales(0, k_smooth=torch.ones(2, 64))
    with pytest.raises(ValueError, match=r"k_smooth must be a float tensor \[Hk=2, D=64\]"):
        KVPool(scheme, 1, 2, 64, n_pages=4, page_size=16).set_static_scales(0, k_smooth=torch.ones(64))
    from kvlab.cache.layout import PageLayout
    lay = PageLayout(kvlab.parse_spec("int4:g32:smooth"), 64, 16, 2)
    pages = lay.allocate(2)
    assert pages["smooth"].shape == (2, 64) and bool(pages["smooth"].isnan().all())
    pages.pop("smooth")
    with pytest.raises(ValueError, match=r"\['smooth'\].*is required"):
        lay.check_pages(pages, "cpu")



def test_export_writes_vectors_of_the_stored_keys(tmp_path):
    """The engine-neutral export of a smoothed scheme: its K vectors are the plain format's bytes of the rows (the
    rows are stored keys, k / s), so kvlab's own encoder of the plain spec passes them; the layout names the factors;
    an engine without the option names it among what it lacks."""
    from kvlab.export.conformance import check_conformance, describe_layout, kvlab_encode_fn
    from kvlab.export.engines import plan
    from kvlab.export.exporter import export
    from kvlab.quant import encode
    sch = kvlab.scheme("k=int4:g32:sym:smooth,v=q4_0")
    export(sch, "json", str(tmp_path / "x"), head_dim=64, vectors=32)
    base = dataclasses.replace(sch.k, smooth=False)

    def enc(x, info):
        spec = base if info["role"] == "k" else sch.v
        return encode(torch.from_numpy(x), spec)
    res = check_conformance(str(tmp_path / "x"), enc)
    assert res["ok"] and len(res["cases"]) >= 4
    assert check_conformance(str(tmp_path / "x"), kvlab_encode_fn)["ok"]
    assert "smoothing" in describe_layout(sch.k, 64) and "smoothing" not in describe_layout(base, 64)
    reasons = " ".join(plan("llama.cpp", kvlab.scheme("k=int4:g32:sym:smooth,v=int4:g32:sym")).reasons)
    assert "calibrated key smoothing" in reasons
