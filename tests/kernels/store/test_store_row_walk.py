"""The token-axis row walk (`store/triton_row_walk.py`, one group a thread) == the oracle bit for bit: the presets it takes
(int2 / int3 / int4 / int8, q4_1, q8_0, mxfp4, nvfp4, nf4, iq4nl), a grid of int and codebook specs (sym / asym,
groups 16-64, GGML packing, rounding modes, scale dtypes, two bit planes), edge values, skipped and partial tiles, odd
head counts, 16-bit inputs; and what it refuses."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from store_cases import DEV, assert_same_pages, make_input, run_store, spec_of
from test_store_edge import edge_input

import kvlab
from kvlab.cache.layout import PageLayout
from kvlab.kernels.store import triton_row_walk as row_walk

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
WORTH = row_walk.worth  # the api's policy, before the fixture replaces it

PRESETS = ["int2", "int3", "q4_0", "q4_1", "q8_0", "mxfp4", "nvfp4", "nf4", "iq4nl", "int4:g32:asym", "int4_had"]
GRID = sorted({str(s.k) for s in kvlab.grid([
    "int{2,3,4,5,6,8}:g{16,32,64}:{sym,asym}", "int5:g32:asym:pack=ggml", "int4:g32:sym:rnd={away,up}:recip", "int4:g32:asym:recip:rnd=up:pack=ggml",
    "int2:g32:asym:pack=ggml", "int4:g16:asym:s={bf16,f32}", "int8:g32:sym:rule=full", "int{4,8}:g32:sym:rule=signed:rnd={even,up}:pack=ggml", "nf4:g32:rule=signed",
    "fp4_e2m1:g{16,32}:s={f16,e8m0,e4m3}", "nf4:g{32,64}:s={f16,bf16}", "iq4nl:g32", "fp4_e2m1:g16:s=e4m3:ts",
    "int{3,4}:g32:asym:rot=had", "int4:g{16,64}:sym:rot=had", "nf4:g32:rot=had", "fp4_e2m1:g16:s=e4m3:ts:rot=had",
    "lm{2,3,4}:g{32,64}", "lm{2,3,4}:g64:rot=had", "lm3:g32:s=bf16:rot=had"])})


@pytest.fixture(autouse=True)
def _walk(monkeypatch):
    """Every spec the kernel can store goes through it (the api's `worth` policy picks fewer)."""
    monkeypatch.setattr(row_walk, "ENABLED", True)
    monkeypatch.setattr(row_walk, "worth", lambda spec, D: True)


def test_worth_picks_two_plane_ints_and_every_rotated_spec():
    assert all(WORTH(spec_of(t) if ":" in t else _spec(t), 128)
               for t in ("int3", "int5:g32:asym", "int4_had", "lm2:rot=had", "lm3:rot=had", "lm4:rot=had",
                         "nf4:g32:rot=had", "fp4_e2m1:g16:s=e4m3:ts:rot=had"))
    assert not any(WORTH(spec_of(t) if ":" in t else _spec(t), 128)
                   for t in ("int2", "q4_0", "nf4", "mxfp4", "nvfp4", "iq4nl", "lm2"))


def _spec(text):
    return spec_of(kvlab.scheme(text).k if ":" not in text else text)


def _check(spec, T=33, Hk=2, D=64, seed=0, dtype=torch.float32, x=None):
    xi, slots, lay, n_pages, kw = make_input(spec, T, Hk, D, seed=seed, dtype=dtype)
    if x is not None:
        xi, lay = x.to(DEV), PageLayout(spec, D, lay.page_size, x.shape[1])
        slots = slots[:x.shape[0]]
    ref, _ = run_store(xi, slots, lay, n_pages, spec, "reference", **kw)
    got, used = run_store(xi, slots, lay, n_pages, spec, "triton", **kw)
    assert used == "triton"
    assert_same_pages(ref, got, str(spec))


@pytest.mark.parametrize("name", PRESETS)
def test_row_walk_presets_bit_exact(name):
    spec = _spec(name)
    assert row_walk.why_not(spec, 64) is None, row_walk.why_not(spec, 64)
    _check(spec, seed=len(name))


@pytest.mark.parametrize("text", GRID)
def test_row_walk_grid_bit_exact(text):
    spec = spec_of(text)
    why = row_walk.why_not(spec, 64)
    if why is not None:
        pytest.skip(why)
    _check(spec, T=19, seed=len(text))


@pytest.mark.parametrize("Hk,D,T", [(3, 64, 5), (1, 128, 200), (8, 128, 130), (4, 256, 9), (2, 32, 64)])
@pytest.mark.parametrize("name", ["int3", "int4_had", "lm3:g32:rot=had"])
def test_row_walk_shapes(name, Hk, D, T):
    _check(_spec(name), T=T, Hk=Hk, D=D, seed=Hk * D)


@pytest.mark.parametrize("name,D", [("int4_had", 64), ("int4_had", 128), ("int4_had", 256), ("nf4:g32:rot=had", 128),
                                    ("fp4_e2m1:g16:s=e4m3:ts:rot=had", 128), ("int3:g32:asym:rot=had", 128),
                                    ("lm3:g32:rot=had", 256), ("lm2:rot=had", 128), ("lm4:rot=had", 256)])
@pytest.mark.parametrize("piece,split", [(32, frozenset()), (64, frozenset()), (32, True), (32, frozenset({"lm4"}))])
def test_rotated_pieces_of_32_or_64_elements(name, D, piece, split, monkeypatch):
    """Rotated specs with pieces of 32 elements a thread (`row_walk.PIECE`, the default) or 64 (before session 31):
    with 32 more of the Hadamard's stages run on lane bits (a pair exchange each); the oracle's bytes either way. A
    group larger than the piece makes the piece (lm2's 64), or, for the formats in `SPLIT_GROUPS` (every one: True;
    the default: lm4), spreads over the threads of its pieces (64 over two)."""
    monkeypatch.setattr(row_walk, "PIECE", piece)
    monkeypatch.setattr(row_walk, "SPLIT_GROUPS", split)
    spec = _spec(name)
    G = spec.group_size(D)
    spread = split is True or spec.fmt in split
    assert row_walk.piece(D, G, spec.fmt) == (min(D, piece) if spread else max(G, min(D, piece)))
    _check(spec, T=37, Hk=2, D=D, seed=D)


def test_split_groups_default_and_environment():
    """lm4 spreads its groups of 64 by default (the one format an H100 timed faster that way); KVLAB_STORE_ROW_SPLIT
    picks none (0), every format (1) or a list, read at import."""
    code = ("from kvlab.kernels.store import triton_row_walk as w; s = w.SPLIT_GROUPS; "
            "print(sorted(s) if s is not True else 'all', w.piece(128, 64, 'lm4'), w.piece(128, 64, 'lm2'))")
    got = {}
    for env in (None, "0", "1", "lm2, lm3"):
        e = {k: v for k, v in os.environ.items() if k not in ("KVLAB_STORE_ROW_SPLIT", "KVLAB_STORE_ROW_PIECE")}
        if env is not None:
            e["KVLAB_STORE_ROW_SPLIT"] = env
        got[env] = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                                  check=True).stdout.split()
    assert got[None] == ["['lm4']", "32", "64"]
    assert got["0"] == ["[]", "64", "64"]
    assert got["1"] == ["all", "32", "32"]
    assert got["lm2, lm3"] == ["['lm2',", "'lm3']", "64", "32"]
    e = {k: v for k, v in os.environ.items() if k != "KVLAB_STORE_ROW_PIECE"}
    for bad in ("yes", "lm5"):  # not 0 / 1 and not a format the walk spreads: refused by name, not ignored
        r = subprocess.run([sys.executable, "-c", code], env={**e, "KVLAB_STORE_ROW_SPLIT": bad}, capture_output=True,
                           text=True)
        assert r.returncode != 0 and f"KVLAB_STORE_ROW_SPLIT={bad}" in r.stderr, r.stderr[-300:]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["int2", "mxfp4"])
def test_row_walk_16_bit_inputs(name, dtype):
    _check(_spec(name), T=40, dtype=dtype)


@pytest.mark.parametrize("name", ["int3", "int2", "q4_0", "q4_1", "mxfp4", "nvfp4", "nf4", "iq4nl", "q8_0", "int4_had",
                                  "lm2:rot=had", "lm4:rot=had"])
def test_row_walk_edge_values(name):
    """Zero groups, ties, NaN, inf, tiny and huge groups and signed extremes (`edge_input`), and zero extremes of
    both signs first."""
    spec = _spec(name)
    x = edge_input(spec)
    x[4, 0, :8] = torch.tensor([0.5, -0.0, 0.0, 1.0, 2.0, 3.0, 0.25, 4.0])  # min 0 (of -0 first) in group 0
    x[5, 0, :8] = torch.tensor([-0.5, 0.0, -0.0, -1.0, -2.0, -3.0, -0.25, -4.0])  # max 0 (+0 first)
    x[6, 0, :32] = 0.5
    x[6, 0, 5], x[6, 0, 12] = -3.0, 3.0  # a tie of magnitudes across chunks: the first (negative) is the extreme
    _check(spec, T=x.shape[0], Hk=1, D=64, x=x)


def test_row_walk_skips_negative_slots():
    spec = _spec("int3")
    x, slots, lay, n_pages, kw = make_input(spec, 40, 2, 64)
    slots = slots.clone()
    slots[3:17] = -1
    ref, _ = run_store(x, slots, lay, n_pages, spec, "reference", **kw)
    got, _ = run_store(x, slots, lay, n_pages, spec, "triton", **kw)
    assert_same_pages(ref, got, "skipped tokens")


@pytest.mark.parametrize("text,why", [("int4:g32:asym:cal", "calibrated"), ("kivi4", "token-axis"),
                                      ("int3:g16:asym", "32-bit words"), ("fp8_e4m3:g32", "fp8"),
                                      ("int4:g128:asym", "groups of 16, 32 or 64")])
def test_row_walk_refuses_with_the_reason(text, why):
    assert why in row_walk.why_not(_spec(text), 128)


def test_row_walk_refuses_rotations_it_cannot_fuse():
    assert "rotated" in row_walk.why_not(spec_of("int4:g32:asym:rot=had"), 96)  # not one power-of-two block


def test_row_walk_refuses_a_non_power_of_two_group_count():
    """Head_dim 96 in groups of 32 (3 a row) would leave a program's last token split across programs."""
    assert "power-of-two count of groups" in row_walk.why_not(_spec("int3"), 96)


def test_walks_need_word_aligned_codes():
    spec = _spec("int3")
    x, slots, lay, n_pages, kw = make_input(spec, 33, 2, 64)
    pages = lay.allocate(n_pages, DEV)
    assert row_walk.fits(pages)
    assert not row_walk.fits(dict(pages, codes=pages["codes"].view(-1)[1:]))


@pytest.mark.parametrize("name", ["int3", "int4_had", "lm2:rot=had", "nf4", "mxfp4"])
def test_row_walk_two_launches(name, monkeypatch):
    """A prefill-sized write codes in two launches (`TWO_PASS`): the main pass flags programs with a rare element,
    the fixup pass recodes only those by the exact path. Forced on a small write with edge groups (tiny scales, NaN,
    inf: rare elements) and a write with none: the bytes equal the oracle's either way."""
    monkeypatch.setattr(row_walk, "TWO_PASS_MIN_TOKENS", 0)
    spec = _spec(name)
    x = edge_input(spec)
    _check(spec, T=x.shape[0], Hk=1, D=64, x=x)
    _check(spec, T=40, seed=3)
