"""Key channel permutations (`perm` K specs): the spec option, the fitted order, the oracle's perm= contract, the
pool's order beside the pages (keys stored permuted, queries gathered at the attention ops), the reference and Triton
decode / extend through the pool, and the export (calibration in the evaluation: tests/eval/test_smoothing_calibration.py)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import kvlab
from kvlab.cache import KVPool
from kvlab.kernels.decode import decode
from kvlab.kernels.extend import extend
from kvlab.quant import dequantize, fake_quantize, fit_smoothing, quantize
from kvlab.quant.permutation import (check_permutation, fit_permutation, permute_channels, permute_queries,
                                     unpermute_channels)

from pool_attend import attend, ops_args

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = 2e-2 if DEV == "cuda" else 1e-4


def _qk(seed=0, Hk=2, group=3, T=96, D=64):
    """Keys with one channel offset by +8 in each run of 16 (every group of a g16 spec gets a wide range; real keys
    have such channels of a steady sign) and queries of even energy: gathering the offset channels into one group is
    what a permutation can buy."""
    g = torch.Generator().manual_seed(seed)
    shift = torch.zeros(D)
    shift[::16] = 8.0
    k = torch.randn(1, Hk, T, D, generator=g) + shift
    q = torch.randn(1, Hk * group, T, D, generator=g)
    return q, k


def _score_err(q, k, kh):
    Hk, D = k.shape[1], k.shape[-1]
    qg = q.reshape(1, Hk, -1, D)
    e = qg @ (kh - k).transpose(-1, -2)
    return float((e - e.mean(-1, keepdim=True)).pow(2).mean())


def test_spec_option_round_trips_and_is_checked():
    s = kvlab.parse_spec("int3:g32:asym:smooth=pair:perm:out=1")
    assert s.permute and s.needs_permutation and kvlab.parse_spec(str(s)) == s
    assert not kvlab.parse_spec("int3:g32:asym").permute
    for bad, msg in (("int3:g32:chan:asym:perm", "per-token groups"), ("bf16:perm", "per-token groups"),
                     ("int4:prerope:perm", "drop prerope or perm")):
        with pytest.raises(ValueError, match=msg):
            kvlab.parse_spec(bad)
    with pytest.raises(ValueError, match="keys only"):
        kvlab.scheme("k=int4,v=int4:perm")
    with pytest.raises(ValueError, match="keys only"):
        kvlab.scheme("int4,L1=int4|int4:perm")
    # a layer's table, not per-token bytes: the bits do not change
    assert s.bits_per_element == dataclasses.replace(s, permute=False).bits_per_element


def test_check_and_apply_permutations():
    p = torch.stack([torch.randperm(8, generator=torch.Generator().manual_seed(h)) for h in range(2)])
    assert torch.equal(check_permutation(p.int(), 2, 8), p)
    for bad, msg in ((p[:, :7], r"\[Hk=2, D=8\]"), (p.float(), "integer tensor"),
                     (torch.zeros(2, 8, dtype=torch.long), "exactly once")):
        with pytest.raises(ValueError, match=msg):
            check_permutation(bad, 2, 8)
    x = torch.randn(5, 2, 8)                                              # [T, Hk, D]
    y = permute_channels(x, p)
    assert torch.equal(y[:, 1, 3], x[:, 1, p[1, 3]])
    assert torch.equal(unpermute_channels(y, p), x)
    xt = x.transpose(0, 1)                                                # [Hk, T, D]
    assert torch.equal(permute_channels(xt, p, heads_dim=-3), y.transpose(0, 1))
    q = torch.randn(3, 6, 8)                                              # [B, Hq, D], 3 query heads a KV head
    # the scores are unchanged: q . k over the same channel order
    assert torch.allclose(torch.einsum("bhd,thd->bht", permute_queries(q, p), y.repeat_interleave(3, 1)),
                          torch.einsum("bhd,thd->bht", q, x.repeat_interleave(3, 1)), atol=1e-5)


def test_fit_gathers_the_wide_channels_and_lowers_the_score_error():
    spec = kvlab.parse_spec("int3:g16:asym:perm")
    base = dataclasses.replace(spec, permute=False)
    q, k = _qk(1)
    p = fit_permutation(k, q, spec)
    check_permutation(p, 2, 64)
    for h in range(2):  # the four wide channels share one group
        groups = {int(torch.nonzero(p[h] == c)) // 16 for c in (0, 16, 32, 48)}
        assert len(groups) == 1
    qe, ke = _qk(2)                                                       # held-out draws
    kh = fake_quantize(ke, spec, perm=p[:, None, :])
    assert _score_err(qe, ke, kh) < 0.6 * _score_err(qe, ke, fake_quantize(ke, base))


def test_fit_is_the_identity_for_one_group_a_head_and_checks_inputs():
    q, k = _qk(3)
    ident = torch.arange(64).expand(2, 64)
    assert torch.equal(fit_permutation(k, q, "int4:g64:perm"), ident)
    g = torch.Generator().manual_seed(0)
    flat_k, flat_q = torch.randn(1, 2, 64, 64, generator=g), torch.randn(1, 2, 64, 64, generator=g)
    p = fit_permutation(flat_k, flat_q, "int4:g16:perm")                  # no structure: the check may keep either
    check_permutation(p, 2, 64)
    with pytest.raises(ValueError, match="does not group channels within a token"):
        fit_permutation(k, q, "int4:g32:chan")
    with pytest.raises(ValueError, match=r"q must be"):
        fit_permutation(k, q[:, :5], "int4:g16:perm")
    with pytest.raises(ValueError, match="past the 96 sinks"):
        fit_permutation(k, q, "int4:g16:perm", sink=96)


def test_oracle_quantizes_the_permuted_keys():
    spec = kvlab.parse_spec("int3:g16:asym:perm")
    base = dataclasses.replace(spec, permute=False)
    q, k = _qk(4)
    p = fit_permutation(k, q, spec)[:, None, :]                           # [Hk, 1, D] against x [1, Hk, T, D]
    qt = quantize(k, spec, perm=p)
    y = dequantize(qt)
    kp = torch.gather(k, -1, p.expand(k.shape))
    assert torch.equal(qt.codes, quantize(kp, base).codes)
    assert torch.equal(y, fake_quantize(k, spec, perm=p))
    assert torch.equal(torch.gather(y, -1, p.expand(k.shape)), fake_quantize(kp, base))
    sspec = kvlab.parse_spec("int3:g16:asym:smooth:perm")                # smoothing first, then the order
    s = fit_smoothing(k, q)[:, None, :]
    ks = k / s
    assert torch.equal(quantize(k, sspec, smooth=s, perm=p).codes,
                       quantize(torch.gather(ks, -1, p.expand(k.shape)), base).codes)
    assert torch.equal(fake_quantize(k, sspec, smooth=s, perm=p), dequantize(quantize(k, sspec, smooth=s, perm=p)))
    with pytest.raises(ValueError, match="pass perm="):
        quantize(k, spec)
    with pytest.raises(ValueError, match="does not permute"):
        quantize(k, base, perm=p)
    with pytest.raises(ValueError, match="exactly once"):
        quantize(k, spec, perm=torch.zeros(2, 1, 64, dtype=torch.long))
    with pytest.raises(ValueError, match="last dim"):
        quantize(k, spec, perm=p[..., :32])
    with pytest.raises(ValueError, match="integer tensor"):
        quantize(k, spec, perm=p.float())


def _pool_with(scheme, k, v, p, s=None, page=16, T0=60):
    Hk, D = k.shape[1], k.shape[2]
    k, v = k.to(DEV), v.to(DEV)
    pool = KVPool(scheme, 1, Hk, D, n_pages=16, page_size=page, device=DEV)
    pool.set_static_scales(0, k_perm=p, **({"k_smooth": s} if s is not None else {}))
    sid = pool.add_sequence()
    pool.append(sid, 0, k[:T0], v[:T0])
    for t in range(T0, k.shape[0]):
        pool.append(sid, 0, k[t:t + 1], v[t:t + 1])
    return pool, sid


SCHEMES = ["k=int3:g16:asym:perm,v=int3:g32:asym,window=8,sink=2", "k=int4:g16:sym:smooth:perm,v=q4_0,window=4",
           "k=int2:g16:asym:perm:out=1,v=int2:g32:asym"]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_pool_decode_and_extend_attend_the_model_keys(scheme, backend):
    """The pool stores k[..., perm] (pages and window) with perm beside the pages; `decode` and `extend` gather q
    (and the chunk's keys) alike: both equal exact attention over the pool's own view of the keys (`dense_kv`, in
    the model's channel order), and (unsmoothed) that view is closer to k than the same pool's without the order."""
    if backend == "triton":
        from kvlab.kernels.env import can_launch
        if not can_launch(torch.empty(0, device=DEV)):
            pytest.skip("the Triton kernels need a GPU or TRITON_INTERPRET=1")
    q, k4 = _qk(5, T=100)
    k, v = k4[0].transpose(0, 1).contiguous(), torch.randn(100, 2, 64, generator=torch.Generator().manual_seed(4))
    sch = kvlab.scheme(scheme)
    s = fit_smoothing(k4, q) if sch.k.smooth else None
    g = torch.Generator().manual_seed(8)  # smoothed keys are balanced already: any order tests the plumbing
    p = fit_permutation(k4, q, sch.k) if s is None else torch.stack([torch.randperm(64, generator=g) for _ in "ab"])
    assert not torch.equal(p, torch.arange(64).expand(2, 64))
    pool, sid = _pool_with(scheme, k, v, p, s)
    assert torch.equal(pool.k_pages[0]["perm"].cpu(), p)
    k, v = k.to(DEV), v.to(DEV)
    kd, vd = pool.dense_kv(sid, 0)                                        # [Hk, T, D], model order
    fp = pool.fp_buffer(0, [sid])
    held = int(fp.length[0])
    if held:  # the window holds the stored (permuted) keys
        pos = fp.positions[0, :held]
        want = k[pos] / s.to(DEV) if s is not None else k[pos]
        assert torch.allclose(fp.k[0, :, :held].float(), permute_channels(want, p.to(DEV)).transpose(0, 1),
                              rtol=TOL / 2, atol=1e-6)
    if s is None:  # the order targets these keys' wide channels (the smoothed ones are balanced already)
        pool0 = KVPool(scheme.replace(":perm", ""), 1, 2, 64, n_pages=16, page_size=16, device=DEV)
        sid0 = pool0.add_sequence()
        pool0.append(sid0, 0, k, v)
        kd0 = pool0.dense_kv(sid0, 0)[0]
        assert (kd - k.transpose(0, 1)).norm() < (kd0 - k.transpose(0, 1)).norm()
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


def test_decode_plan_reads_the_new_query_and_checks_the_order():
    q, k4 = _qk(6, T=100)
    k, v = k4[0].transpose(0, 1).contiguous(), torch.randn(100, 2, 64)
    pool, sid = _pool_with(SCHEMES[0], k, v, fit_permutation(k4, q, "int3:g16:asym:perm"))
    args, kw = ops_args(pool, sid)
    qd = torch.randn(1, 6, 64).to(DEV)
    run = decode(qd, *args, **kw, backend="reference", plan=True)
    first = run().clone()
    qd.mul_(-2.0)  # read in place on the next call, gathered again
    assert torch.allclose(run(), decode(qd, *args, **kw, backend="reference"))
    assert not torch.allclose(run(), first)
    pages = dict(args[0])
    pages.pop("perm")
    with pytest.raises(ValueError, match=r"k_pages\['perm'\].*is required"):
        decode(qd, pages, *args[1:], **kw)
    pages["perm"] = torch.zeros(2, 64, dtype=torch.long, device=DEV)
    with pytest.raises(ValueError, match="exactly once"):
        decode(qd, pages, *args[1:], **kw)


def test_pool_order_is_set_before_the_first_append_or_stays_the_identity():
    scheme = SCHEMES[0]
    k, v = torch.randn(40, 2, 64), torch.randn(40, 2, 64)
    pool = KVPool(scheme, 1, 2, 64, n_pages=8, page_size=16)
    sid = pool.add_sequence()
    pool.append(sid, 0, k, v)
    assert torch.equal(pool.k_pages[0]["perm"], torch.arange(64).expand(2, 64))  # no queries seen: no reorder
    with pytest.raises(ValueError, match="already holds tokens"):
        pool.set_static_scales(0, k_perm=torch.arange(64).expand(2, 64))
    with pytest.raises(ValueError, match="takes no channel permutation"):
        KVPool("q4_0", 1, 2, 64, n_pages=4, page_size=16).set_static_scales(0, k_perm=torch.arange(64).expand(2, 64))
    with pytest.raises(ValueError, match=r"k_perm must be an integer tensor \[Hk=2, D=64\]"):
        KVPool(scheme, 1, 2, 64, n_pages=4, page_size=16).set_static_scales(0, k_perm=torch.arange(64))
    from kvlab.cache.layout import PageLayout
    lay = PageLayout(kvlab.parse_spec("int4:g32:perm"), 64, 16, 2)
    pages = lay.allocate(2)
    assert pages["perm"].dtype == torch.int64 and pages["perm"].shape == (2, 64)
    pages.pop("perm")
    with pytest.raises(ValueError, match=r"\['perm'\].*is required"):
        lay.check_pages(pages, "cpu")
    pages["perm"] = torch.arange(64).expand(2, 64).clone()
    with pytest.raises(ValueError, match="does not permute"):
        PageLayout(kvlab.parse_spec("int4:g32"), 64, 16, 2).check_pages(pages, "cpu")


def test_store_takes_the_stored_keys_and_needs_the_order():
    from kvlab.cache.layout import PageLayout
    from kvlab.kernels.store import store
    spec = kvlab.parse_spec("int4:g32:asym:perm")
    lay = PageLayout(spec, 64, 16, 2)
    pages = lay.allocate(2)
    x = torch.randn(16, 2, 64)
    store(x, pages, torch.arange(16), spec, page_size=16, backend="reference")
    plain = PageLayout(dataclasses.replace(spec, permute=False), 64, 16, 2).allocate(2)
    store(x, plain, torch.arange(16), "int4:g32:asym", page_size=16, backend="reference")
    assert torch.equal(pages["codes"][0], plain["codes"][0])  # page 0: the plain format's codes of the rows given
    pages.pop("perm")
    with pytest.raises(ValueError, match=r"pages\['perm'\]"):
        store(x, pages, torch.arange(16), spec, page_size=16, backend="reference")


def test_export_writes_vectors_of_the_stored_keys(tmp_path):
    from kvlab.export.conformance import check_conformance, describe_layout, kvlab_encode_fn
    from kvlab.export.engines import plan
    from kvlab.export.exporter import export
    sch = kvlab.scheme("k=int4:g32:sym:perm,v=q4_0")
    export(sch, "json", str(tmp_path / "x"), head_dim=64, vectors=32)
    assert check_conformance(str(tmp_path / "x"), kvlab_encode_fn)["ok"]
    base = dataclasses.replace(sch.k, permute=False)
    assert "permutation" in describe_layout(sch.k, 64) and "permutation" not in describe_layout(base, 64)
    reasons = " ".join(plan("llama.cpp", kvlab.scheme("k=int4:g32:sym:perm,v=int4:g32:sym")).reasons)
    assert "channel permutation" in reasons
