"""The full-precision window policy and append planning (pure Python)."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import kvlab
from kvlab.cache.window import FpPolicy, chan_group, plan_append


def test_chan_group_is_lcm_over_layers():
    assert chan_group(kvlab.scheme("q4_0"), 4) == 1
    assert chan_group(kvlab.scheme("kivi4"), 4) == 32
    s = kvlab.scheme("k=int4:g32:chan:asym,v=int4:g64:chan:asym,L0=int4:g16:chan")
    assert chan_group(s, 3) == 64
    assert FpPolicy.of(kvlab.scheme("kivi4"), 2).capacity == 128 + 31


def test_n_quantized():
    p = FpPolicy(sink=4, window=8, group=16)
    assert [p.n_quantized(n) for n in (0, 4, 12, 27, 28, 44)] == [0, 0, 0, 0, 16, 32]
    assert FpPolicy(0, 0, 1).n_quantized(5) == 5


@settings(max_examples=200, deadline=None)
@given(sink=st.integers(0, 5), window=st.integers(0, 9), group=st.sampled_from([1, 2, 4, 8]),
       steps=st.lists(st.integers(0, 40), min_size=1, max_size=12))
def test_plan_keeps_rows_compact_and_complete(sink, window, group, steps):
    pol = FpPolicy(sink, window, group)
    rows, n, buf = [], 0, {}  # buf: row -> position, simulating the buffer tensor
    for T in steps:
        p = plan_append(pol, rows, n, T)
        nq0, nq1 = p.q_range
        assert nq0 == pol.n_quantized(n) and nq1 == pol.n_quantized(n + T)
        quantized = [buf[r] for r in p.quant_rows] + [n + i for i in range(*p.quant_new)]
        assert quantized == list(range(sink + nq0, sink + nq1))  # position order, nothing missing
        moved = {dst: buf[src] for src, dst in p.moves}
        buf.update(moved)
        for i, dst in p.writes:
            buf[dst] = n + i
        n += T
        rows = p.rows
        assert len(rows) <= pol.capacity
        assert all(buf[r] == pos for r, pos in enumerate(rows))
        want = set(range(min(n, sink))) | set(range(sink + nq1, n))
        assert sorted(rows) == sorted(want)


def test_decode_step_reuses_the_leaving_row():
    pol = FpPolicy(0, 4, 1)
    p = plan_append(pol, [], 0, 4)
    p2 = plan_append(pol, p.rows, 4, 1)
    assert p2.quant_rows == [0] and p2.writes == [(0, 0)] and not p2.moves
