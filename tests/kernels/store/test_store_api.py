"""store() input checks (ValueError naming the problem), dispatch, laziness, autotune key, random specs."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from store_cases import DEV, assert_same_pages, make_input, run_store

import kvlab
from kvlab.cache.layout import PageLayout
from kvlab.kernels.store import store, supports_triton

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _setup(text="q4_1", T=4, Hk=2, D=64, P=16, N=2):
    spec = kvlab.scheme(text).k
    lay = PageLayout(spec, D, P, Hk)
    return spec, torch.randn(T, Hk, D, device=DEV), lay.allocate(N, DEV), torch.arange(T, device=DEV)


@pytest.mark.parametrize("case,match", [
    ("rank", "x must be a tensor"), ("dtype", "x dtype"), ("heads", "pages\\['codes'\\] has shape"),
    ("head_dim", "does not divide head_dim"), ("pages_dtype", "dtype"), ("missing_zeros", "zeros"),
    ("extra_scales", "stores no scales"), ("slot_shape", "slot_mapping must be"), ("slot_dtype", "slot_mapping dtype"),
    ("slot_range", "slot_mapping values"), ("backend", "backend="), ("page_size", "page_size=4"),
    ("device", "x on meta"), ("not_dict", "pages must be a dict"),
])
def test_bad_inputs(case, match):
    spec, x, pages, slots = _setup()
    kw = {}
    if case == "rank":
        x = x[0]
    elif case == "dtype":
        x = x.to(torch.int32)
    elif case == "heads":
        x = torch.randn(4, 3, 64, device=DEV)
    elif case == "head_dim":
        x = torch.randn(4, 2, 48, device=DEV)
    elif case == "pages_dtype":
        pages["scales"] = pages["scales"].float()
    elif case == "missing_zeros":
        pages["zeros"] = None
    elif case == "extra_scales":
        spec = kvlab.scheme("fp8_e4m3").k
        pages = PageLayout(spec, 64, 16, 2).allocate(2, DEV)
        pages["scales"] = torch.zeros(2, 2, 16, 1, device=DEV)
    elif case == "slot_shape":
        slots = slots[:2]
    elif case == "slot_dtype":
        slots = slots.float()
    elif case == "slot_range":
        slots = slots + 100
    elif case == "backend":
        kw["backend"] = "cuda"
    elif case == "page_size":
        kw["page_size"] = 4
    elif case == "device":
        x = x.to("meta")
    elif case == "not_dict":
        pages = pages["codes"]
    with pytest.raises(ValueError, match=match):
        store(x, pages, slots, spec, **kw)


def test_static_scale_rules():
    spec, x, pages, slots = _setup("q4_0")
    with pytest.raises(ValueError, match="takes none|does not take one"):
        store(x, pages, slots, spec, scale=1.0)
    with pytest.raises(ValueError, match="has none"):
        store(x, pages, slots, spec, tensor_scale=1.0)
    spec, x, pages, slots = _setup("int8:tensor")
    with pytest.raises(ValueError, match="needs scale="):
        store(x, pages, slots, spec)
    spec, x, pages, slots = _setup("nvfp4")
    with pytest.raises(ValueError, match="needs tensor_scale="):
        store(x, pages, slots, spec)
    with pytest.raises(ValueError, match="one value"):
        store(x, pages, slots, spec, tensor_scale=torch.ones(2))
    spec = kvlab.parse_spec("nf4:tensor")
    x = torch.randn(4, 2, 64, device=DEV)
    with pytest.raises(ValueError, match="axis tensor with nf4"):
        store(x, {"codes": torch.zeros(2, 2, 16, 32, dtype=torch.uint8)}, slots, spec, scale=1.0)


def test_chan_needs_whole_aligned_groups():
    spec = kvlab.scheme("kivi4").k
    pages = PageLayout(spec, 64, 32, 2).allocate(2, DEV)
    with pytest.raises(ValueError, match="whole groups of 32"):
        store(torch.randn(31, 2, 64, device=DEV), pages, torch.arange(31, device=DEV), spec)
    with pytest.raises(ValueError, match="consecutive slots"):
        store(torch.randn(32, 2, 64, device=DEV), pages, torch.arange(32, device=DEV) + 1, spec)


def test_triton_needs_gpu_or_interpreter(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    spec, x, pages, slots = _setup()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        store(x, pages, slots, spec, backend="triton")


def test_mse_runs_reference():
    spec = kvlab.parse_spec("int4:g32:asym:rule=mse")
    assert not supports_triton(spec)[0]
    x, slots, lay, n_pages, kw = make_input(spec, T=3)
    assert run_store(x, slots, lay, n_pages, spec, "triton")[1] == "reference"
    assert run_store(x, slots, lay, n_pages, spec, "auto")[1] == "reference"  # auto never picks what cannot run


def test_autotune_key_and_configs():
    from kvlab.kernels.store import triton as tk
    assert "T" not in tk.AUTOTUNE_KEY and {"D", "HK", "FMT", "BITS", "G"} <= set(tk.AUTOTUNE_KEY)
    cands = [tk.triton.Config({"BLOCK_R": c.block_r}, num_warps=c.num_warps) for c in tk.CANDIDATES]
    chan = tk._prune(cands, {}, D=64, CHAN=True, GP=32, NGP=1)
    assert chan and all(c.kwargs["BLOCK_R"] <= 64 for c in chan)
    wide = tk._prune(cands, {}, D=256, CHAN=False, GP=32, NGP=8)
    assert all(c.kwargs["BLOCK_R"] * 256 <= 8192 for c in wide)


@pytest.mark.parametrize("name,D,want", [
    ("kivi4", 128, (64, 1)), ("kivi4", 64, (64, 1)), ("int2:g32:chan:asym", 256, (64, 1)),
    ("int4_had", 128, (16, 2)), ("lm3:g64:rot=had", 128, (16, 4)), ("bf16", 128, (8, 4)), ("q4_0", 128, (32, 4)),
    ("fp8_e4m3", 128, (32, 4)), ("nf4", 64, (32, 4)), ("int4:g16:chan:asym", 16, (16, 1)),
])
def test_default_store_config_by_family(name, D, want):
    """Where no tuned entry matches, the store runs its family's default tile (the H200's measured winners), clipped
    to the autotuner's own bound: channel rows no more than head_dim, at most 8192 tile elements."""
    from kvlab.kernels.store import triton as tk
    spec = kvlab.scheme(name).k
    cfg = tk.default_config(spec, D, 8)
    assert (cfg.block_r, cfg.num_warps) == want, name
    assert cfg.block_r * tk.kernel_params(spec, D)["GP"] * tk.kernel_params(spec, D)["NGP"] <= 8192
    assert cfg in tk.candidates(spec, D, 8), "the default is one of the tiles the autotuner and tune() time"


@pytest.mark.parametrize("name", ["kivi4", "int3:g32:chan:asym", "q4_0", "bf16", "int4_had", "nf4", "fp4_e2m1:g32:rot=had"])
@pytest.mark.parametrize("D", [8, 64, 256, 2048])
def test_default_store_config_is_always_a_candidate(name, D):
    """At the edges of head_dim (8: fewer channel rows than the family's tile; 2048: a token row past the tile bound)
    the default is still a tile `tune` and the autotuner would time, not one outside their space."""
    from kvlab.kernels.store import triton as tk
    spec = kvlab.scheme(name).k
    try:
        tk.kernel_params(spec, D)
    except ValueError:
        pytest.skip(f"{name} is not stored by the kernel at head_dim {D}")
    assert tk.default_config(spec, D, 8) in tk.candidates(spec, D, 8)


@pytest.mark.parametrize("autotune", ["0", "1"])
def test_untuned_store_key_gets_the_default_tile_not_the_autotuner(autotune, monkeypatch):
    """On a GPU (here: the api told it is not interpreting) a key with no tuned entry launches
    `default_config`'s tile: a first write never waits minutes for Triton's autotuner, which KVLAB_STORE_AUTOTUNE=1
    restores (the backend then gets config None). A tuned entry still wins over the default. (The group-row kernel's
    tiles: KIVI keys take the channel walk by default, which has its own launch shape, so the walks are off here.)"""
    from kvlab.kernels.configs import StoreConfig
    from kvlab.kernels.store import api, triton_chan_walk, triton_row_walk
    from kvlab.kernels.store import triton as tk
    monkeypatch.setattr(triton_chan_walk, "ENABLED", False)
    monkeypatch.setattr(triton_row_walk, "ENABLED", False)
    seen = []
    monkeypatch.setattr(api, "interpreting", lambda: False)
    monkeypatch.setattr(tk, "run", lambda *a, config=None, **kw: seen.append(config))
    monkeypatch.setattr(api, "lookup", lambda key: None)
    monkeypatch.setenv("KVLAB_STORE_AUTOTUNE", autotune)
    spec, x, pages, slots = _setup("kivi4", T=32, D=64, P=32)
    assert store(x, pages, slots, spec, page_size=32, backend="triton") == "triton"
    assert seen[-1] == (None if autotune == "1" else StoreConfig(block_r=64, num_warps=1))
    monkeypatch.setattr(api, "lookup", lambda key: StoreConfig(block_r=8, num_warps=2))
    store(x, pages, slots, spec, page_size=32, backend="triton")
    assert seen[-1] == StoreConfig(block_r=8, num_warps=2)


def test_explicit_store_config_runs_and_bad_ones_are_rejected():
    from kvlab.kernels.configs import StoreConfig
    spec = kvlab.scheme("q4_0").k
    x, slots, lay, n_pages, kw = make_input(spec, T=37)
    want, _ = run_store(x, slots, lay, n_pages, spec, "reference", **kw)
    got, used = run_store(x, slots, lay, n_pages, spec, "triton", config=StoreConfig(block_r=8, num_warps=2), **kw)
    assert used == "triton"
    assert all(torch.equal(got[k].cpu().view(torch.uint8), want[k].view(torch.uint8)) for k in want if want[k] is not None)
    with pytest.raises(ValueError, match="block_r=5"):
        run_store(x, slots, lay, n_pages, spec, "triton", config={"block_r": 5}, **kw)


def test_spec_is_constexprs_only():
    """A new scheme changes only the constexprs of the one kernel."""
    from kvlab.kernels.store.triton import kernel_params
    a, b = kernel_params(kvlab.scheme("q4_0").k, 64), kernel_params(kvlab.parse_spec("int7:g16:asym"), 64)
    assert a.keys() == b.keys() and a != b


def test_import_is_lazy():
    code = ("import sys, kvlab, kvlab.kernels, kvlab.kernels.store, kvlab.cache; "
            "assert 'triton' not in sys.modules, 'triton imported eagerly'")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


_spec = st.builds(
    lambda bits, g, sym, rnd, recip, ggml, sdt: kvlab.parse_spec(
        f"int{bits}:g{g}:{'sym' if sym else 'asym'}:rnd={rnd}" + (":recip" if recip else "")
        + (":pack=ggml" if ggml else "") + f":s={sdt if sym or sdt != 'e8m0' else 'f16'}"),
    st.integers(2, 8), st.sampled_from([8, 16, 32, 64]), st.booleans(), st.sampled_from(["even", "away", "up"]),
    st.booleans(), st.booleans(), st.sampled_from(["f16", "bf16", "f32", "e8m0"]))


@settings(max_examples=12, deadline=None)
@given(spec=_spec, T=st.integers(1, 20), scale=st.sampled_from([1e-3, 1.0, 37.0]), seed=st.integers(0, 99))
def test_random_int_specs_bit_exact(spec, T, scale, seed):
    x, slots, lay, n_pages, kw = make_input(spec, T=T, Hk=1, D=64, seed=seed, scale=scale)
    assert_same_pages(run_store(x, slots, lay, n_pages, spec, "reference", **kw)[0],
                      run_store(x, slots, lay, n_pages, spec, "triton", **kw)[0], str(spec))


def test_kernel_spec_names_the_launched_kernel():
    """Rotated specs keep their rotation where the kernel rotates (token rows of a power-of-two head_dim of one
    Hadamard block), else the kernel sees them unrotated; tuned configs are keyed by that spec (store call, tune(),
    the sweep's speed stage)."""
    import dataclasses

    import kvlab
    from kvlab.kernels.configs import fuses_rotation
    from kvlab.kernels.configs import store_kernel_spec as kernel_spec
    had = kvlab.scheme("int4:g32:asym:rot=had").k
    plain = dataclasses.replace(had, rotation="none")
    assert fuses_rotation(had, 128) and kernel_spec(had, 128) == had
    assert fuses_rotation(had, 64) and fuses_rotation(had, 256)
    assert not fuses_rotation(had, 96) and kernel_spec(had, 96) == plain  # blocks of 32: rotated in torch first
    chan = kvlab.scheme("int4:g32:chan:asym:rot=had").k
    assert kernel_spec(chan, 128) == dataclasses.replace(chan, rotation="none")
    assert kernel_spec(plain, 128) == plain


def test_walk_of_follows_the_switches_the_policy_and_the_alignment(monkeypatch):
    """`api.walk_of` names the walk `store` runs (what the store table records as its config; both walks on by
    default, KVLAB_STORE_CHAN_WALK / KVLAB_STORE_ROW_WALK=0 turn them off): none while both are off;
    KIVI keys to the channel walk, rotated and two-plane ints to the row walk, one-plane ints to neither; none on codes
    that do not start on a word."""
    from kvlab.kernels.store import api as store_api
    from kvlab.kernels.store import triton_chan_walk, triton_row_walk

    def pages(spec):
        return PageLayout(spec, 128, max(16, spec.group), 2).allocate(4, "cpu")
    kivi, had, q4 = (kvlab.scheme(n).k for n in ("kivi4", "int4_had", "q4_0"))
    monkeypatch.setattr(triton_chan_walk, "ENABLED", False)
    monkeypatch.setattr(triton_row_walk, "ENABLED", False)
    assert all(store_api.walk_of(s, 128, pages(s)) is None for s in (kivi, had, q4))
    monkeypatch.setattr(triton_chan_walk, "ENABLED", True)
    monkeypatch.setattr(triton_row_walk, "ENABLED", True)
    assert store_api.walk_of(kivi, 128, pages(kivi)) == "chan_walk"
    assert store_api.walk_of(had, 128, pages(had)) == "row_walk"
    assert store_api.walk_of(q4, 128, pages(q4)) is None
    p = pages(had)
    assert store_api.walk_of(had, 128, dict(p, codes=p["codes"].view(-1)[1:])) is None


def test_walks_are_on_by_default():
    """Both walks are on unless their switch says 0 (a fresh interpreter reads the environment)."""
    code = ("from kvlab.kernels.store import triton_chan_walk as c, triton_row_walk as r; "
            "print(c.ENABLED, c.WORD_LOOP, r.ENABLED)")
    env = {k: v for k, v in os.environ.items() if k not in ("KVLAB_STORE_CHAN_WALK", "KVLAB_STORE_ROW_WALK")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == ["True", "True", "True"]
    env.update(KVLAB_STORE_CHAN_WALK="0", KVLAB_STORE_ROW_WALK="0")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == ["False", "True", "False"]
