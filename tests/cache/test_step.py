"""DecodeStep: a decode step planned once on the host and written by index tensors leaves the pool exactly as
per-layer appends do (pages, fp window, block table), for token-axis, channel-axis, windowed and float specs,
sequences of different lengths in scattered slots, idle slots; bad plans change nothing and say why."""
from __future__ import annotations

import pytest
import torch

import kvlab
from kvlab.cache import DecodeStep, KVPool

SCHEMES = ["q4_0", "fp8_e4m3", "bf16", "int3:g32:asym,window=5,sink=2",
           "k=int4:g32:chan:asym,v=int4:g32:asym,window=8,sink=2", "k=int2:g16:chan:asym,v=nf4:g32",
           "k=int4:g32:chan:asym,v=int4:g32:asym,window=3,L0.h1=q8_0|bf16,L1.h0=int2:g16:chan:asym|nf4:g32"]
L, HK, D = 2, 2, 64


def _page(scheme):
    sch = kvlab.scheme(scheme)
    return max([16] + [s.group for pair in sch.pairs(L) for s in pair if s.axis == "chan"])


def _pools(scheme):
    return [KVPool(scheme, L, HK, D, 64, _page(scheme), max_seqs=5) for _ in range(2)]


def _kv(gen, n):
    return (torch.randn(n, HK, D, generator=gen), torch.randn(n, HK, D, generator=gen))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_step_writes_equal_per_layer_appends(scheme):
    a, b = _pools(scheme)
    slots = {4: 11, 1: 40, 2: 3}  # slot -> prompt length; slot 0 and 3 idle
    gen = torch.Generator().manual_seed(0)
    seqs = {}
    for slot, n in slots.items():
        sa, sb = a.add_sequence(row=slot), b.add_sequence(row=slot)
        seqs[slot] = (sa, sb)
        for layer in range(L):
            k, v = _kv(gen, n)
            a.append(sa, layer, k, v)
            b.append(sb, layer, k, v)
    step = DecodeStep(b, slots=5, max_tokens=200)
    for t in range(70):
        live = [s for s in sorted(slots) if not (s == 2 and t >= 50)]  # slot 2 stops after 50 steps
        step.plan({s: seqs[s][1] for s in live})
        for layer in range(L):
            k, v = torch.randn(5, HK, D, generator=gen), torch.randn(5, HK, D, generator=gen)
            a.append_batch([seqs[s][0] for s in live], layer, k[live], v[live])
            step.write(layer, k, v)
    for slot, (sa, sb) in seqs.items():
        assert a.seq_len(sa) == b.seq_len(sb) and a.pages_of(sa) == b.pages_of(sb)
        for layer in range(L):
            for x, y in zip(a.dense_kv(sa, layer), b.dense_kv(sb, layer)):
                assert torch.equal(x, y)
    bt = a.block_table([seqs[s][0] for s in sorted(slots)])
    live = sorted(step.slot_seqs)
    n = {s: int(step.kv_indptr[s + 1] - step.kv_indptr[s]) for s in range(5)}
    assert n[0] == n[3] == 0 and live == [1, 4]  # idle slots hold no pages
    want = dict(zip(sorted(slots), bt.lengths().tolist()))
    got = {s: int(n[s] and (n[s] - 1) * _page(scheme) + int(step.kv_last_page_len[s])) for s in (1, 4)}
    assert got == {s: want[s] for s in (1, 4)}
    for s in (1, 4):  # the step's table lists the pool's pages, and its fp lengths and positions are the pool's
        ids = step.kv_indices[int(step.kv_indptr[s]):int(step.kv_indptr[s + 1])].tolist()
        assert ids == b.pages_of(seqs[s][1])[:n[s]]
        assert int(step.fp_len[s]) == len(b._seq(seqs[s][1]).rows[0])
        assert int(step.positions[s]) == b.seq_len(seqs[s][1]) - 1


def test_bad_plans_change_nothing_and_say_why():
    pool = KVPool("q4_0", L, HK, D, 4, 16, max_seqs=3)
    s = pool.add_sequence(row=2)
    for layer in range(L):
        pool.append(s, layer, *_kv(torch.Generator().manual_seed(1), 63))
    step = DecodeStep(pool, slots=3, max_tokens=128)
    with pytest.raises(ValueError, match="not in its slot 0"):
        step.plan({0: s})
    with pytest.raises(ValueError, match=r"slot 5 is not in \[0, 3\)"):
        step.plan({5: s})
    with pytest.raises(ValueError, match="unknown sequence id"):
        step.plan({1: 99})
    step.plan({2: s})  # 64 tokens: 4 pages, all there are
    for layer in range(L):
        step.write(layer, torch.zeros(3, HK, D), torch.zeros(3, HK, D))
    before = (pool.seq_len(s), pool.pages_of(s), pool.n_free_pages)
    with pytest.raises(ValueError, match="out of pages"):
        step.plan({2: s})
    assert (pool.seq_len(s), pool.pages_of(s), pool.n_free_pages) == before
    other = KVPool("q4_0", L, HK, D, 4, 16, max_seqs=3)
    t = other.add_sequence(row=0)
    other.append(t, 0, *_kv(torch.Generator().manual_seed(3), 1))  # layer 1 left behind
    with pytest.raises(ValueError, match="layers hold different token counts"):
        DecodeStep(other, slots=1, max_tokens=16).plan({0: t})
    with pytest.raises(ValueError, match="fp row 2 is not free"):
        pool.add_sequence(row=2)
    with pytest.raises(ValueError, match=r"k must be a tensor \[3, 2, 64\]"):
        step.write(0, torch.zeros(2, HK, D), torch.zeros(3, HK, D))
    with pytest.raises(ValueError, match="slots must be an int"):
        DecodeStep(pool, slots=4, max_tokens=16)


def test_step_bounds_the_context_it_hands_decode():
    """The step's block table holds at most max_tokens (rounded up to pages) a slot: decode gets that bound, which
    caps its split count (`decode(max_kv_len=)`)."""
    pool = KVPool("q4_0", L, HK, D, 4, 16, max_seqs=3)
    step = DecodeStep(pool, slots=2, max_tokens=100)
    assert step.attention_args(0)[1]["max_kv_len"] == 112  # 7 pages of 16


def test_static_scales_need_a_prefill_first():
    pool = KVPool("int8:tensor", L, HK, D, 8, 16, max_seqs=2)
    s = pool.add_sequence(row=0)
    step = DecodeStep(pool, slots=2, max_tokens=64)
    step.plan({0: s})
    with pytest.raises(ValueError, match="static scales"):
        step.write(0, torch.zeros(2, HK, D), torch.zeros(2, HK, D))
