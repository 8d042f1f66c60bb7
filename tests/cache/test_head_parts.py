"""Per-head specs (`L<i>.h<j>=`): the DSL round-trips them and refuses what a mixed layer cannot hold; a mixed layer's
pool keeps one page set per group of KV heads, each holding exactly what a pool of that spec holds for those heads;
bytes and capacity count each group; the layer-wide views refuse a mixed layer and say where to look."""
from __future__ import annotations

import pytest
import torch

import kvlab
from kvlab.cache import KVPool
from kvlab.cache.capacity import page_bytes
from kvlab.cache.head_parts import part_queries
from kvlab.spec import KVScheme

L, HK, D, P = 2, 3, 64, 32
MIXED = "k=int4:g32:chan:asym,v=int4:g32:asym,window=3,L0.h1=q8_0|bf16,L1.h0=int2:g32:chan:asym|nf4:g32,L1.h2=lm3"


def test_text_and_dict_round_trip():
    sch = kvlab.scheme(MIXED)
    assert kvlab.scheme(str(sch)) == sch and KVScheme.from_dict(sch.to_dict()) == sch
    assert [(l, h) for l, h, *_ in sch.head_overrides] == [(0, 1), (1, 0), (1, 2)]
    assert sch.head_specs(1, L, HK)[1] == sch.for_layer(1, L)  # head 1 keeps the layer's pair
    groups = sch.head_groups(1, L, HK)
    assert [h for _, h in groups] == [(0,), (1,), (2,)]
    assert kvlab.scheme("q4_0").head_groups(0, L, HK) == [((kvlab.scheme("q4_0").k,) * 2, (0, 1, 2))]
    assert sch.chan_group(L) == 32 and "head_overrides" not in kvlab.scheme("q4_0").to_dict()


@pytest.mark.parametrize("text,match", [
    ("q4_0,L0.h1=nvfp4", "calibrated state"),
    ("q4_0,L0.h1=int4:g32:chan:asym:smooth|int4:g32:asym", "calibrated state"),
    ("q4_0,L0.h1=int4:g32:prerope|int4:g32", "prerope"),
    ("q4_0,L0.h1=q8_0,L0.h1=lm3", "appears twice"),
    ("q4_0,L0.x1=q8_0", "L<i>.h<j>=SPEC"),
])
def test_bad_head_overrides_say_why(text, match):
    with pytest.raises(ValueError, match=match):
        kvlab.scheme(text)


def test_a_mixed_layer_refuses_stateful_base_specs_and_heads_the_model_lacks():
    with pytest.raises(ValueError, match="calibrated state"):
        KVPool("k=int4:g32:asym:smooth,v=int4:g32:asym,L0.h1=q8_0", L, HK, D, 8)
    with pytest.raises(ValueError, match="heads 0..2"):
        KVPool("q4_0,L1.h3=q8_0", L, HK, D, 8)
    KVPool("k=int4:g32:asym:smooth,v=int4:g32:asym,L0=q4_0,L0.h1=q8_0", L, HK, D, 8)  # layer 0 is not smoothed


def _fill(pool, gen, n=70):
    s = pool.add_sequence()
    for layer in range(L):
        pool.append(s, layer, torch.randn(n, HK, D, generator=gen), torch.randn(n, HK, D, generator=gen))
    return s


def test_each_group_holds_what_a_pool_of_its_spec_holds_for_its_heads():
    sch = kvlab.scheme(MIXED)
    mixed = KVPool(sch, L, HK, D, 16, P)
    s = _fill(mixed, torch.Generator().manual_seed(0))
    k_all, v_all = zip(*(mixed.dense_kv(s, layer) for layer in range(L)))
    for layer in range(L):
        parts = mixed.layer_parts(layer)
        assert len(parts) == (2 if layer == 0 else 3)
        for part, lc in parts:
            chan = kvlab.scheme("k=int4:g32:chan:asym,v=int4:g32:asym")  # the other layer: the same policy (Gc 32)
            alone = KVScheme(k=part.k_spec, v=part.v_spec, window=3, overrides=((1 - layer, chan.k, chan.v),))
            one = KVPool(alone, L, HK, D, 16, P)
            t = _fill(one, torch.Generator().manual_seed(0))  # the same tokens, every head
            ref = one.layer_cache(layer)
            for got, want in ((lc.k_pages, ref.k_pages), (lc.v_pages, ref.v_pages)):
                for name, x in got.items():
                    if x is not None and x.dim() > 1:  # full pages [N, H, ...]: the part's heads, bit for bit
                        full = mixed.n_quantized(s, layer) // P
                        assert full == 2
                        used, theirs = mixed.pages_of(s)[:full], one.pages_of(t)[:full]
                        assert torch.equal(x[used], want[name][theirs][:, part.index]), name
            k1, v1 = one.dense_kv(t, layer)
            assert torch.equal(k_all[layer][part.index], k1[part.index])
            assert torch.equal(v_all[layer][part.index], v1[part.index])
    with pytest.raises(ValueError, match="layer_parts"):
        mixed.layer_cache(0)
    assert mixed.k_pages[0] is None and mixed.layouts[0] is None


def test_bytes_count_each_group():
    sch = kvlab.scheme(MIXED)
    pool = KVPool(sch, L, HK, D, 4, P)
    assert pool.bytes_per_token() * P == page_bytes(sch, L, HK, D, P)
    lone = {k: KVPool(k, L, HK, D, 4, P).bytes_per_token() for k in ("k=int4:g32:chan:asym,v=int4:g32:asym",)}
    assert pool.bytes_per_token() != lone["k=int4:g32:chan:asym,v=int4:g32:asym"]
    want = sch.bits_per_element(D, n_layers=L, n_kv_heads=HK) * 2 * L * HK * D / 8
    assert pool.bytes_per_token() == pytest.approx(want)


def test_part_queries_follow_gqa():
    pool = KVPool("q4_0,L0.h1=q8_0", L, HK, D, 4)
    (a, _), (b, _) = pool.layer_parts(0)
    assert part_queries(a, 9, 3).tolist() == [0, 1, 2, 6, 7, 8] and part_queries(b, 9, 3).tolist() == [3, 4, 5]
