"""The non-finite contract through the kernels: a NaN / +inf / -inf key or value token

- is stored by the Triton store as the oracle stores it (its group's scale NaN; hypothesis over specs);
- reaches attention through the paged pool with either store function: the KV head holding it attends to
  NaN with the reference, Triton and, where it runs, Gluon decode, and Triton extend, while every other
  head's and sequence's output is unchanged: an inf key never silently vanishes from attention.
"""
from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import kvlab
from kvlab.cache import KVPool
from kvlab.cache.layout import PageLayout
from kvlab.cache.paging import calibrate, read_values
from kvlab.kernels.decode import decode
from kvlab.kernels.extend import extend
from kvlab.kernels.store import pool_store, store

DEV = "cuda" if torch.cuda.is_available() else "cpu"
SPECIALS = {"nan": float("nan"), "+inf": float("inf"), "-inf": -float("inf")}
SPECS = ["q4_0", "q4_1", "q8_0", "int3:g32:asym", "int2:g16:asym", "int6:g32:sym:pack=ggml", "fp8_e4m3",
         "fp8_e4m3:g32", "fp8_e5m2:g32:s=e8m0", "mxfp4", "nvfp4", "nf4", "iq4nl", "int4:g32:s=e4m3", "int4:head:asym",
         "int4:g32:asym:rot=had", "int4:g16:chan:asym", "int8:g32:chan", "fp8_e4m3:tensor:rule=absmax", "bf16"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(SPECS), kind=st.sampled_from(list(SPECIALS)), t=st.integers(0, 31),
       h=st.integers(0, 1), d=st.integers(0, 63))
def test_triton_store_keeps_the_contract(name, kind, t, h, d):
    spec = kvlab.scheme(name).k
    assume(not spec.is_float_storage)
    T, Hk, D, P = 32, 2, 64, 32
    x = torch.randn(T, Hk, D, generator=torch.Generator().manual_seed(t))
    bad, ref = x.clone(), x.clone()
    bad[t, h, d], ref[t, h, d] = SPECIALS[kind], 0.0
    kw = {k: v for k, v in zip(("scale", "tensor_scale"), calibrate(ref, spec)) if v is not None}
    out = {}
    for label, xx, dev, backend in (("oracle", bad, "cpu", "reference"), ("kernel", bad, DEV, "triton"),
                                    ("clean", ref, "cpu", "reference")):
        pages = PageLayout(spec, D, P, Hk).allocate(1, dev)
        store(xx.to(dev), pages, torch.arange(T, device=dev), spec, backend=backend,
              **{k: v.to(dev) for k, v in kw.items()})
        out[label] = read_values({k: (None if v is None else v.cpu()) for k, v in pages.items()}, spec, [0], T, D,
                                 scale=kw.get("scale"), tensor_scale=kw.get("tensor_scale")).transpose(0, 1)
    y, yk, yc = out["oracle"], out["kernel"], out["clean"]  # [T, Hk, D]
    assert torch.equal(torch.isnan(y), torch.isnan(yk)) and torch.equal(y.nan_to_num(), yk.nan_to_num()), name
    own = torch.isnan(y)
    assert own[t, h, d] and own.sum() < y.numel(), f"{name}: {kind} did not poison its group, or poisoned all"
    assert torch.equal(y[~own], yc[~own]), f"{name}: {kind} changed values outside its group"


def _pool_with_bad_token(name: str, store_fn, kind: str, which: str):
    """A one-layer pool of 2 sequences (200 and 45 tokens); sequence 0's token 20 (a quantized one, past every
    window) has a non-finite key or value element. Returns (pool, scheme)."""
    s = kvlab.scheme(name)
    Hk, D = 2, 64
    pool = KVPool(s, 1, Hk, D, n_pages=16, page_size=32, max_seqs=2, device=DEV, fp_dtype=torch.float32,
                  store=store_fn)
    g = torch.Generator().manual_seed(0)
    for n, sid in ((200, pool.add_sequence()), (45, pool.add_sequence())):
        k, v = torch.randn(n, Hk, D, generator=g), torch.randn(n, Hk, D, generator=g)
        if sid == 0:
            (k if which == "k" else v)[20, 1, 5] = SPECIALS[kind]
        pool.append(sid, 0, k.to(DEV), v.to(DEV))
    return pool, s


def _prefix_args(pool):
    """decode / extend arguments of sequences 0 and 1 of layer 0 (no fp buffer where the scheme keeps none)."""
    lc = pool.layer_cache(0)
    bt, fp = pool.block_table([0, 1]), pool.fp_buffer(0, [0, 1])
    has_fp = fp.k.shape[2] > 0
    return ((lc.k_pages, lc.v_pages, bt.kv_indptr, bt.kv_indices, bt.kv_last_page_len, lc.k_spec, lc.v_spec,
             pool.page_size),
            dict(k_fp=fp.k if has_fp else None, v_fp=fp.v if has_fp else None, fp_len=fp.length if has_fp else None,
                 k_tensor_scale=lc.k_tensor_scale, v_tensor_scale=lc.v_tensor_scale))


POOL_CASES = [(n, kind, which) for n in ("q4_0", "nvfp4", "int4:g32:s=e4m3", "kivi4", "fp8_e4m3", "q8_0,window=4")
              for kind in SPECIALS for which in ("k", "v")][::2]


@pytest.mark.parametrize("name,kind,which", POOL_CASES, ids=[f"{n}-{k}-{w}" for n, k, w in POOL_CASES])
def test_non_finite_token_shows_up_in_attention(name, kind, which):
    """Both store functions write the same pages; decode (reference, Triton) and extend (Triton) give NaN for
    the sequence holding the bad token and the reference's values for the other one."""
    pools = {"oracle": _pool_with_bad_token(name, None, kind, which)[0],
             "kernel": _pool_with_bad_token(name, pool_store, kind, which)[0]}
    k0, v0 = pools["oracle"].dense_kv(0, 0)
    k1, v1 = pools["kernel"].dense_kv(0, 0)
    assert torch.equal(torch.isnan(k0), torch.isnan(k1)) and torch.equal(torch.isnan(v0), torch.isnan(v1))
    assert torch.isnan(k0 if which == "k" else v0)[1, 20].any(), "the bad token's group is not NaN in the pool"
    args, kw = _prefix_args(pools["kernel"])
    q = torch.randn(2, 4, 64, generator=torch.Generator().manual_seed(1)).to(DEV)
    ref = decode(q, *args, **kw, backend="reference")
    got = decode(q, *args, **kw)
    for out in (ref, got):
        assert (~torch.isfinite(out[0, 2:])).all(), "the KV head holding the bad token must not come out finite"
        assert torch.isfinite(out[0, :2]).all() and torch.isfinite(out[1]).all(), "NaN leaked to other heads/seqs"
    assert (got[1].float() - ref[1].float()).abs().max() / ref[1].abs().max() < (2e-2 if DEV == "cuda" else 1e-4)
    C = 3  # a chunk of 3 new tokens per sequence over the same prefix
    qe = torch.randn(2 * C, 4, 64, generator=torch.Generator().manual_seed(2)).to(DEV)
    kn = torch.randn(2 * C, 2, 64, generator=torch.Generator().manual_seed(3)).to(DEV)
    qo = torch.tensor([0, C, 2 * C], dtype=torch.int32, device=DEV)
    ext = extend(qe, kn, kn.clone(), qo, *args, **kw)
    assert (~torch.isfinite(ext[:C, 2:])).all() and torch.isfinite(ext[:C, :2]).all() and torch.isfinite(ext[C:]).all()


@pytest.mark.skipif(not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"),
                    reason="the emulated Gluon kernel's split merge is a Triton kernel: GPU or interpreter")
@pytest.mark.parametrize("name,kind", [("q4_0", "+inf"), ("q8_0", "nan"), ("fp8_e4m3", "-inf")])
def test_gluon_decode_shows_the_bad_token(name, kind, monkeypatch):
    """The Gluon MMA decode (emulated on the CPU, compiled on a GPU) keeps the same contract."""
    gluon = pytest.importorskip("kvlab.kernels.decode.gluon", exc_type=ImportError)
    s = kvlab.scheme(name)
    Hk, D = 2, 128
    pool = KVPool(s, 1, Hk, D, n_pages=16, page_size=16, max_seqs=2, device=DEV, fp_dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    for n in (70, 45):
        sid = pool.add_sequence()
        k, v = torch.randn(n, Hk, D, generator=g), torch.randn(n, Hk, D, generator=g)
        if sid == 0:
            k[20, 1, 5] = SPECIALS[kind]
        pool.append(sid, 0, k.to(DEV), v.to(DEV))
    args, kw = _prefix_args(pool)
    q = torch.randn(2, 8, D, generator=torch.Generator().manual_seed(1)).to(DEV, torch.bfloat16)
    ref = decode(q.float(), *args, **kw, backend="reference")
    cfg = kvlab.kernels.GluonDecodeConfig(num_splits=2)
    if DEV == "cuda":
        got = decode(q, *args, **kw, config=cfg)
    else:
        from devtools.gluon_emu import emulate
        from kvlab.kernels.checks import check_prefix
        monkeypatch.setattr(gluon, "_decode_mma_kernel", emulate(gluon._decode_mma_kernel))
        got = gluon.run(q, check_prefix(q, *args, *kw.values(), 2), D ** -0.5, cfg)
    assert torch.isnan(got[0, 4:]).all() and torch.isfinite(got[0, :4]).all() and torch.isfinite(got[1]).all()
    assert (got[1].float() - ref[1]).abs().max() / ref[1].abs().max() < 2e-2
