"""The channel-axis token walk (`store/triton_chan_walk.py`) == the oracle bit for bit: KIVI's presets, a grid of int
channel-axis specs (sym / asym, 2 / 4 / 8 bits, groups 16-128, GGML packing, rounding modes, bf16 scales), edge
values (zero extremes with both signs of zero, NaN, inf, tiny and huge groups), skipped groups, odd head counts and
head_dims, 16-bit inputs; and what it refuses."""
from __future__ import annotations

import pytest
import torch
from store_cases import DEV, assert_same_pages, make_input, run_store, spec_of
from test_store_edge import edge_input

import kvlab
from kvlab.cache.layout import PageLayout
from kvlab.kernels.store import triton_chan_walk as chan_walk

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

SPECS = sorted({str(s.k) for s in kvlab.grid([
    "int{2,4}:g{16,32,64}:chan:{sym,asym}", "int8:g32:chan:{sym,asym}", "int2:g128:chan:asym",
    "int4:g32:chan:asym:s=bf16", "int4:g32:chan:sym:rnd={away,up}",
    "int4:g32:chan:sym:rule=full", "int4:g32:chan:asym:recip"])} | {str(kvlab.scheme(n).k) for n in ("kivi4", "kivi2")})


@pytest.fixture(autouse=True)
def _walk(monkeypatch):
    monkeypatch.setattr(chan_walk, "ENABLED", True)


def _check(spec, T=64, Hk=2, D=64, seed=0, dtype=torch.float32, x=None):
    xi, slots, lay, n_pages, kw = make_input(spec, T, Hk, D, seed=seed, dtype=dtype)
    if x is not None:
        xi, lay = x.to(DEV), PageLayout(spec, D, lay.page_size, x.shape[1])
    ref, _ = run_store(xi, slots, lay, n_pages, spec, "reference", **kw)
    got, used = run_store(xi, slots, lay, n_pages, spec, "triton", **kw)
    assert used == "triton"
    assert_same_pages(ref, got, str(spec))


@pytest.mark.parametrize("text", SPECS)
def test_walk_bit_exact(text):
    spec = spec_of(text)
    assert chan_walk.why_not(spec, 64) is None, chan_walk.why_not(spec, 64)
    _check(spec, T=2 * spec.group, seed=len(text))


@pytest.mark.parametrize("Hk,D", [(3, 64), (1, 128), (8, 128), (4, 256), (5, 96)])
def test_walk_head_counts_and_dims(Hk, D):
    _check(spec_of("kivi4"), T=64, Hk=Hk, D=D, seed=Hk * D)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_walk_16_bit_inputs(dtype):
    _check(spec_of("kivi2"), T=96, Hk=2, D=64, dtype=dtype)


@pytest.mark.parametrize("text", ["int4:g32:chan:asym", "int4:g32:chan:sym:rnd=away", "int2:g32:chan:asym"])
def test_walk_edge_values(text):
    """Zero groups, ties, NaN, inf, tiny, huge and signed extremes over the first token group (`edge_input`); a
    zero extreme takes the first zero's sign, so -0 is planted first in one channel and +0 in another."""
    spec = spec_of(text)
    x = edge_input(spec)
    x[:, 0, 20] = torch.linspace(0.5, 4.0, x.shape[0])
    x[2, 0, 20] = -0.0  # min is a zero: the first zero (-0) gives its sign
    x[5, 0, 20] = 0.0
    x[:, 0, 21] = -torch.linspace(0.5, 4.0, x.shape[0])
    x[1, 0, 21] = 0.0  # max is a zero: +0 first
    x[4, 0, 21] = -0.0
    _check(spec, T=x.shape[0], Hk=1, D=64, x=x)


def test_walk_skips_groups_with_negative_slots():
    spec = spec_of("kivi4")
    x, slots, lay, n_pages, kw = make_input(spec, 96, 2, 64)
    slots = slots.clone()
    slots[32:64] = -1
    ref, _ = run_store(x, slots, lay, n_pages, spec, "reference", **kw)
    got, _ = run_store(x, slots, lay, n_pages, spec, "triton", **kw)
    assert_same_pages(ref, got, "skipped group")


@pytest.mark.parametrize("text,why", [("int3:g32:chan:asym", "2, 4 or 8 bits"), ("q4_0", "not a channel-axis"),
                                      ("int2:g8:chan:asym", "words"), ("int4:g32:chan:sym:rule=signed", "absmax")])
def test_walk_refuses_with_the_reason(text, why):
    assert why in chan_walk.why_not(spec_of(text), 64)


@pytest.mark.parametrize("text", ["kivi4", "kivi2", "int8:g32:chan:sym", "int2:g128:chan:asym", "int4:g16:chan:asym"])
def test_walk_word_at_a_time_bit_exact(text, monkeypatch):
    """`WORD_LOOP`: pass 2 makes and stores one packed word at a time (a run-time word index)."""
    monkeypatch.setattr(chan_walk, "WORD_LOOP", True)
    spec = spec_of(kvlab.scheme(text).k if text.startswith("kivi") else text)
    _check(spec, T=2 * spec.group, Hk=3, D=64, seed=7)


@pytest.mark.parametrize("word_loop", [False, True])
@pytest.mark.parametrize("text", ["int4:g32:chan:asym", "int2:g32:chan:asym", "int4:g32:chan:sym:rnd=away"])
def test_walk_two_launches(text, word_loop, monkeypatch):
    """A prefill-sized write codes in two launches (`TWO_PASS`): the main pass flags programs whose scale is out of
    Markstein's range, the fixup pass recodes those by IEEE division. Forced on a small write with edge groups (tiny
    and huge scales) and on one without: the oracle's bytes either way."""
    monkeypatch.setattr(chan_walk, "TWO_PASS_MIN_TOKENS", 0)
    monkeypatch.setattr(chan_walk, "WORD_LOOP", word_loop)
    spec = spec_of(text)
    x = edge_input(spec)
    _check(spec, T=x.shape[0], Hk=1, D=64, x=x)
    _check(spec, T=64, seed=5)


@pytest.mark.parametrize("lane", [4, 8])
@pytest.mark.parametrize("text,Hk,D", [("kivi4", 8, 128), ("kivi2", 3, 64), ("int8:g32:chan:sym", 4, 256)])
def test_walk_lane_channels(text, Hk, D, lane, monkeypatch):
    """`LANE_ELEMS`: 4 channels a thread (twice the warps) or 8 (the default); the oracle's bytes either way. It only
    changes num_warps, which the interpreter ignores: on the CPU this checks the launch, the GPU run checks the layout
    (`bash benchmarks/h200_run.sh s32s` runs this file with KVLAB_STORE_CHAN_LANE=4)."""
    monkeypatch.setattr(chan_walk, "LANE_ELEMS", lane)
    spec = spec_of(kvlab.scheme(text).k if text.startswith("kivi") else text)
    _check(spec, T=2 * spec.group, Hk=Hk, D=D, seed=lane + Hk)


def test_walk_lane_environment():
    """KVLAB_STORE_CHAN_LANE picks 4 or 8 channels a thread at import; anything else is refused by name."""
    import os
    import subprocess
    import sys
    code = "from kvlab.kernels.store import triton_chan_walk as w; print(w.LANE_ELEMS)"
    env = {k: v for k, v in os.environ.items() if k != "KVLAB_STORE_CHAN_LANE"}
    run = lambda e: subprocess.run([sys.executable, "-c", code], env={**env, **e}, capture_output=True, text=True)  # noqa: E731
    assert run({}).stdout.split() == ["8"]
    assert run({"KVLAB_STORE_CHAN_LANE": "4"}).stdout.split() == ["4"]
    bad = run({"KVLAB_STORE_CHAN_LANE": "16"})
    assert bad.returncode != 0 and "KVLAB_STORE_CHAN_LANE=16" in bad.stderr and "4 or 8" in bad.stderr
