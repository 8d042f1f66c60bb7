"""KVPool: dense_kv == oracle over appended tokens, views, batch decode, Triton store, errors."""
from __future__ import annotations

import os

import pytest
import torch

import kvlab
from kvlab.cache import KVPool

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
L, HK, D = 2, 2, 64
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def expected(pool, sid, layer, K, V):
    """Oracle view of tokens K, V [T, Hk, D]: fp positions exact, quantized ones through the oracle."""
    S, nq = pool.policy.sink, pool.n_quantized(sid, layer)
    lc = pool.layer_cache(layer)
    out = []
    for X, spec, s, ts in ((K, lc.k_spec, lc.k_scale, lc.k_tensor_scale), (V, lc.v_spec, lc.v_scale,
                                                                            lc.v_tensor_scale)):
        x = X.to(pool.fp_dtype).float().transpose(0, 1).clone()  # [Hk, T, D]
        kw = {"scale": s} if s is not None else {}
        if spec.tensor_scale:
            kw["tensor_scale"] = ts
        if nq:
            x[:, S:S + nq] = kvlab.dequantize(kvlab.quantize(x[:, S:S + nq], spec, **kw)).float()
        out.append(x)
    return out


def fill(pool, sid, steps, seed=0, layers=None):
    g = torch.Generator().manual_seed(seed)
    ks, vs = [], []
    for T in steps:
        k, v = torch.randn(T, HK, D, generator=g), torch.randn(T, HK, D, generator=g)
        for layer in (range(pool.n_layers) if layers is None else layers):
            pool.append(sid, layer, k.to(pool.device), v.to(pool.device))
        ks.append(k)
        vs.append(v)
    return torch.cat(ks), torch.cat(vs)


SCHEMES = ["q4_0", "q4_0,window=4,sink=2", "k=int4:g16:chan:asym,v=int4:g32:asym,window=8",
           "kivi2", "nvfp4,window=3", "fp8_e4m3:tensor:rule=absmax", "int8:tensor,sink=1",
           "int4_had,window=5", "k=int4:g32:asym:prerope,v=q8_0", "q4_1,L0=bf16,L-1=int3:g32:asym", "bf16",
           "k=int3:g16:chan:asym:out=2,v=int2:g32:asym:out=1,window=4", "lm3:g64:rot=had:out=1,L1=nf4:out=3"]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_dense_kv_is_the_oracle(scheme):
    pool = KVPool(scheme, L, HK, D, n_pages=24, page_size=32, max_seqs=3)
    a, b = pool.add_sequence(), pool.add_sequence()
    K, V = fill(pool, a, [70, 1, 1, 33, 1, 29, 1], seed=1)
    fill(pool, b, [5, 1, 1], seed=2)
    for layer in range(L):
        k, v = pool.dense_kv(a, layer)
        ek, ev = expected(pool, a, layer, K, V)
        assert torch.equal(k, ek) and torch.equal(v, ev)
        n, nq = pool.seq_len(a, layer), pool.n_quantized(a, layer)
        assert n == K.shape[0] and nq == pool.policy.n_quantized(n)
        fp = pool.fp_buffer(layer, [a, b])
        assert fp.length.tolist() == [n - nq, 7 - pool.n_quantized(b, layer)]
        held = fp.positions[0, :fp.length[0]]
        assert torch.equal(fp.k[0, :, :fp.length[0]].float(), k[:, held])
        bt = pool.block_table([a, b], layer)
        assert bt.lengths().tolist() == [nq, pool.n_quantized(b, layer)]
        assert bt.kv_indices[:bt.kv_indptr[1]].tolist() == pool.pages_of(a)[:-(-nq // 32)]


def test_layer_overrides_and_prerope():
    pool = KVPool("q4_1,L0=bf16,L-1=int3:g32:asym", 3, HK, D, n_pages=8, page_size=16)
    assert [str(k) for k, _ in pool.specs] == ["bf16", str(kvlab.parse_spec("q4_1")), "int3:g32:asym"]
    pool = KVPool("k=int4:g32:asym:prerope,v=q8_0", 1, HK, D, n_pages=8)
    assert pool.specs[0][0].pre_rope  # stored as given: the pool never applies RoPE


def test_append_batch_equals_single_appends():
    pools = [KVPool("k=int4:g16:chan:asym,v=q4_0,window=3,sink=1", L, HK, D, 16, 16, max_seqs=3) for _ in range(2)]
    for p in pools:
        ids = [p.add_sequence() for _ in range(3)]
        for i, s in enumerate(ids):
            fill(p, s, [5 + 7 * i], seed=i)
    g = torch.Generator().manual_seed(9)
    for _ in range(20):
        k, v = torch.randn(3, HK, D, generator=g), torch.randn(3, HK, D, generator=g)
        for layer in range(L):
            pools[0].append_batch([0, 1, 2], layer, k, v)
            for b in range(3):
                pools[1].append(b, layer, k[b:b + 1], v[b:b + 1])
    for s in range(3):
        for layer in range(L):
            assert all(torch.equal(x, y) for x, y in zip(pools[0].dense_kv(s, layer), pools[1].dense_kv(s, layer)))


@pytest.mark.parametrize("scheme", ["q4_0,window=4,sink=1", "k=int4:g16:chan:asym,v=mxfp4,window=2", "nvfp4"])
def test_triton_store_backend_matches_reference(scheme):
    # the reference runs on the CPU (the GGML-exact oracle; see tests/kernels/store/store_cases.py)
    from kvlab.kernels.store import pool_store
    pools = {be: KVPool(scheme, 1, HK, D, 8, 16, max_seqs=2, store=fn, device=dev, fp_dtype=torch.float32)
             for be, fn, dev in (("reference", None, "cpu"), ("triton", pool_store, DEV))}
    for p in pools.values():
        for t in (*p.k_pages[0].values(), *p.v_pages[0].values()):
            if t is not None:
                t.view(torch.uint8).zero_()  # page memory starts uninitialised: compare written bytes only
        s = p.add_sequence()
        fill(p, s, [37, 1, 1, 16], seed=3)
    r, t = pools["reference"], pools["triton"]
    for a, b in ((r.k_pages[0], t.k_pages[0]), (r.v_pages[0], t.v_pages[0])):
        for key in a:
            if a[key] is not None:
                used = torch.tensor(r.pages_of(0))
                assert torch.equal(a[key][used].view(torch.uint8), b[key][used].cpu().view(torch.uint8)), key
    assert all(torch.equal(x, y.cpu()) for x, y in zip(r.dense_kv(0, 0), t.dense_kv(0, 0)))


def test_free_reuses_pages_and_rows():
    pool = KVPool("q4_0", 1, HK, D, n_pages=4, page_size=16, max_seqs=2)
    a = pool.add_sequence()
    fill(pool, a, [64])
    assert pool.n_free_pages == 0
    with pytest.raises(ValueError, match="max_seqs=2"):
        [pool.add_sequence() for _ in range(2)]
    pool.free(a)
    assert pool.n_free_pages == 4
    c = pool.add_sequence()
    K, V = fill(pool, c, [60], seed=5)
    assert sorted(pool.pages_of(c)) == [0, 1, 2, 3]
    assert torch.equal(pool.dense_kv(c, 0)[0], expected(pool, c, 0, K, V)[0])


def test_out_of_pages_changes_nothing():
    pool = KVPool("q4_0,window=2", 1, HK, D, n_pages=2, page_size=16, max_seqs=2)
    a = pool.add_sequence()
    fill(pool, a, [20])
    before = (pool.seq_len(a), pool.pages_of(a), pool.n_free_pages, pool.dense_kv(a, 0)[0].clone())
    with pytest.raises(ValueError, match="out of pages: this append needs 1 more"):
        pool.append(a, 0, torch.randn(20, HK, D), torch.randn(20, HK, D))
    assert (pool.seq_len(a), pool.pages_of(a), pool.n_free_pages) == before[:3]
    assert torch.equal(pool.dense_kv(a, 0)[0], before[3])


def test_static_scales():
    pool = KVPool("k=fp8_e4m3:tensor:rule=absmax,v=nvfp4", 2, HK, D, n_pages=4)
    pool.set_static_scales(1, k_scale=0.5, v_tensor_scale=0.25)
    with pytest.raises(ValueError, match="takes no tensor_scale"):
        pool.set_static_scales(1, k_tensor_scale=1.0)
    s = pool.add_sequence()
    K, V = fill(pool, s, [8])
    lc0, lc1 = pool.layer_cache(0), pool.layer_cache(1)
    assert lc0.k_scale == K.abs().amax() / 448 and lc0.v_tensor_scale == V.abs().amax() / (6 * 448)
    assert lc1.k_scale == 0.5 and lc1.k_tensor_scale == 0.5 and lc1.v_tensor_scale == 0.25
    with pytest.raises(ValueError, match="already holds tokens"):
        pool.set_static_scales(0, k_scale=1.0)


def test_bad_inputs():
    pool = KVPool("q4_0", L, HK, D, n_pages=4, page_size=16, max_seqs=2)
    s = pool.add_sequence()
    k = torch.randn(3, HK, D)
    for args, match in [((s, 0, k[0], k), "k must be a tensor"), ((s, 0, k, k[:2]), "k has 3 tokens but v has 2"),
                        ((s, 0, k.int(), k), "k dtype"), ((s, 0, k.to("meta"), k), "k is on meta"),
                        ((s, 0, torch.randn(3, HK + 1, D), k), "must be a tensor \\[T, 2, 64\\]"),
                        ((99, 0, k, k), "unknown sequence id 99"), ((s, L, k, k), "layer must be an int in")]:
        with pytest.raises(ValueError, match=match):
            pool.append(*args)
    with pytest.raises(ValueError, match="appears twice"):
        pool.append_batch([s, s], 0, k[:2], k[:2])
    with pytest.raises(ValueError, match="unknown sequence"):
        pool.free(99)
    for kwargs, match in [(dict(scheme="nf4:tensor"), "axis tensor with nf4"), (dict(head_dim=48), "does not divide"),
                          (dict(scheme="kivi4", page_size=16), "multiple of it"), (dict(store="triton"), "store must be a function"),
                          (dict(n_pages=0), "n_pages must be")]:
        a = dict(scheme="q4_0", n_layers=L, n_kv_heads=HK, head_dim=D, n_pages=4, page_size=16) | kwargs
        with pytest.raises(ValueError, match=match):
            KVPool(a.pop("scheme"), **a)
