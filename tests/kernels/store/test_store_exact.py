"""Triton store == oracle (through the reference store) bit for bit, for every preset and a grid sample."""
from __future__ import annotations

import random
import zlib

import pytest
import torch
from store_cases import DEV, POISON, assert_same_pages, make_input, run_store, spec_id, spec_of

import kvlab
from kvlab.spec import ALL_PRESETS

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _specs_of_presets():
    out = {}
    for name in ALL_PRESETS:
        s = kvlab.scheme(name)
        out[name] = s.k
        if s.v != s.k:
            out[name + "/v"] = s.v
    return out


PRESETS = _specs_of_presets()


def _check(spec, T=17, Hk=2, D=64, P=16, seed=0, dtype=torch.float32):
    x, slots, lay, n_pages, kw = make_input(spec, T, Hk, D, P, seed=seed, dtype=dtype)
    ref, _ = run_store(x, slots, lay, n_pages, spec, "reference", **kw)
    tri, used = run_store(x, slots, lay, n_pages, spec, "triton", **kw)
    if spec.rule != "mse":
        assert used == "triton"
    assert_same_pages(ref, tri, str(spec))
    return x, slots, lay, ref


@pytest.mark.parametrize("name", list(PRESETS), ids=[f"T17-H2-D64-{spec_id(n)}" for n in PRESETS])
def test_preset_bit_exact(name):
    _check(PRESETS[name])


GRID = [s.k for s in kvlab.grid("int{2,3,4,5,6,7,8}:g{32,64}:{sym,asym}")]
_rng = random.Random(1)
VARIANTS = sorted({str(s.k) for s in kvlab.grid([
    "int{2,3,4,5,6,7,8}:g32:sym:rnd={away,up}:recip",
    "int{3,4,5,6,8}:g32:asym:recip:rnd=up:pack=ggml",
    "int{4,5,8}:g32:sym:rule=signed:rnd={even,up}:pack=ggml",
    "int{2,4,6}:g16:asym:s={bf16,f32}",
    "int{3,4,8}:g8:sym:s=e8m0",
    "int{4,6}:head:{sym,asym}",
    "int{2,3,4,7}:g{16,32}:chan:{sym,asym}",
    "int4:g64:chan:asym:s=bf16",
    "fp8_e4m3:g{16,32}:s={f16,e8m0}", "fp8_e5m2:g32:s=f32", "fp4_e2m1:g{16,32}:s={f16,e8m0,e4m3}",
    "nf4:g{32,64}:s={f16,bf16}", "iq4nl:g32:rule={signed,absmax}", "nf4:g32:rule=signed",
    "int{4,8}:tensor:sym", "int8:tensor:rule=signed:recip", "fp8_e5m2:tensor:rule=absmax:s=e8m0",
    "int{3,5}:g32:asym:rot=had", "fp4_e2m1:g16:s=e4m3:ts:rot=had",
])})
SAMPLE = GRID + [kvlab.scheme(t).k for t in _rng.sample(VARIANTS, min(40, len(VARIANTS)))]


@pytest.mark.parametrize("spec", SAMPLE, ids=[f"T9-H2-D64-{spec_id(s)}" for s in SAMPLE])
def test_grid_bit_exact(spec):
    _check(spec, T=9, seed=zlib.crc32(str(spec).encode()) % 1000)


@pytest.mark.parametrize("D,spec", [(80, "int4:g16:asym"), (96, "int4:g24:sym"), (96, "q8_0"), (128, "q4_0"),
                                    (128, "kivi4"), (80, "fp8_e4m3"), (96, "int5:g48:asym:rnd=away"),
                                    (128, "nvfp4"), (256, "int3:g128:asym")],
                         ids=lambda v: f"D{v}" if isinstance(v, int) else spec_id(v))
def test_head_dims_bit_exact(D, spec):
    _check(spec_of(spec), T=5, Hk=1, D=D)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", ["q4_0", "kivi4", "bf16", "fp16", "fp8_e4m3"])
def test_half_inputs_bit_exact(name, dtype):
    _check(spec_of(name), T=7, dtype=dtype)


def test_only_given_slots_written():
    spec = spec_of("q4_1")
    x, slots, lay, n_pages, kw = make_input(spec, T=5, n_pages=3)
    pages, _ = run_store(x, slots, lay, n_pages, spec, "triton")
    per_slot = pages["codes"].transpose(1, 2).reshape(n_pages * lay.page_size, -1)  # [slots, Hk * row_bytes]
    written = torch.zeros(n_pages * lay.page_size, dtype=torch.bool, device=DEV)
    written[slots] = True
    assert (per_slot[~written] == POISON).all()
    assert not (per_slot[written] == POISON).all(1).any()


LLOYD_MAX = [s.k for s in kvlab.grid("lm{2,3,4}:g{32,64}")] + [spec_of(t) for t in (
    "lm4:head", "lm3:g32:rot=had", "lm2:g16:chan", "lm4:g32:s=bf16", "lm3:g64:chan",
    "lm3:g64:rot=had:cal", "lm2:g16:chan:cal", "lm4:g32:cal")]  # cal: levels fitted to the input, in pages["codebook"]


CAL_INTS = [spec_of(t) for t in ("int2:g32:chan:asym:cal", "int3:g32:asym:cal", "int4:g32:cal", "int2:g64:asym:cal",
                                 "int4:g16:sym:rule=signed:cal", "int2:g64:asym:rot=had:cal", "int4:head:asym:cal",
                                 "int3:g16:chan:asym:cal", "int4:g32:asym:s=bf16:cal")]


@pytest.mark.parametrize("spec", CAL_INTS, ids=[f"T33-H2-D64-{spec_id(s)}" for s in CAL_INTS])
def test_calibrated_ints_bit_exact(spec):
    """Calibrated ints (`int<b>:cal`): the int's scale and zero, then the nearest of the levels fitted to the input
    (pages["codebook"]) over x - zero, as the oracle; codes, scales and zeros equal."""
    _check(spec, T=33 if spec.axis != "chan" else 64, seed=zlib.crc32(str(spec).encode()) % 1000)


@pytest.mark.parametrize("spec", LLOYD_MAX, ids=[f"T33-H2-D64-{spec_id(s)}" for s in LLOYD_MAX])
def test_lloyd_max_bit_exact(spec):
    """Lloyd-Max codebooks scaled by the group RMS (summed in float64 by both sides): codes and scales equal."""
    _check(spec, T=33 if spec.axis != "chan" else 64, seed=zlib.crc32(str(spec).encode()) % 1000)
