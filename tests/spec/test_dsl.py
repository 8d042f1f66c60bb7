"""Spec DSL, schemes, presets and grids."""
import json

import pytest
from hypothesis import given, settings, strategies as st

import kvlab
from kvlab.spec import ALL_PRESETS, KVQuantSpec, KVScheme, expand, grid, parse_spec


@pytest.mark.parametrize("name", ALL_PRESETS)
def test_preset_text_round_trip(name):
    s = kvlab.scheme(name)
    assert kvlab.scheme(str(s)) == s
    assert KVScheme.from_dict(json.loads(json.dumps(s.to_dict()))) == s


def test_documented_examples():
    s = kvlab.scheme("k=int4:g32:chan:asym,v=int4:g32:asym,window=128")
    assert s.k.axis == "chan" and s.v.axis == "tok" and not s.k.sym and s.window == 128
    assert s == kvlab.scheme("kivi4")
    assert kvlab.scheme("q4_0").k == kvlab.scheme("q4_0").v
    assert kvlab.scheme("q4_0").k.bytes_per_element == 18 / 32  # GGML block_q4_0: 16 B codes + fp16 d per 32
    assert kvlab.scheme("q8_0").k.bytes_per_element == 34 / 32
    assert kvlab.scheme("mxfp4").k.bytes_per_element == 17 / 32
    assert kvlab.scheme("nvfp4").k.bytes_per_element == 9 / 16
    assert kvlab.scheme("int4:g32:asym:rot=had").k.rotation == "had"
    assert len(kvlab.grid("int{2,3,4,8}:g{32,64}:{sym,asym}")) == 16


def test_overrides_and_for_layer():
    s = kvlab.scheme("q4_0,window=64,sink=4,L0=bf16,L-1=bf16")
    assert s.for_layer(0, 30)[0].fmt == "bf16" and s.for_layer(29, 30)[1].fmt == "bf16"
    assert s.for_layer(5, 30) == (s.k, s.v)
    assert kvlab.scheme(str(s)) == s
    # amortized bits: 4.5 payload, 68 of 2048 tokens at 16 bits; first/last layer 16 bits
    eff = s.bits_per_element(128, context=2048)
    assert eff == pytest.approx((68 * 16 + (2048 - 68) * 4.5) / 2048)
    assert s.bits_per_element(128, context=2048, n_layers=30) > eff


def test_layer_overrides_with_separate_k_and_v():
    s = kvlab.scheme("lm3:rot=had,L1=int4:g32:chan:asym|int4:g32:asym,L2=q8_0")
    assert s.for_layer(1, 30)[0].axis == "chan" and s.for_layer(1, 30)[1].axis == "tok"
    assert s.for_layer(2, 30)[0] == s.for_layer(2, 30)[1] and s.for_layer(3, 30) == (s.k, s.v)
    assert "L1=int4:g32:chan:asym|int4:g32:asym" in str(s) and kvlab.scheme(str(s)) == s
    assert KVScheme.from_dict(s.to_dict()) == s
    with pytest.raises(ValueError, match="prerope cannot be set through a layer override"):
        kvlab.scheme("q4_0,L0=q4_0|int4:g32:prerope")
    with pytest.raises(ValueError, match="a layer override is"):
        KVScheme(k=s.k, v=s.v, overrides=((0,),))


def test_grid_mapping():
    g = grid({"k": "int{2,4}:g32:chan:asym", "v": ["int4:g32", "q8_0"], "window": [0, 128]})
    assert len(g) == 8 and all(isinstance(x, KVScheme) for x in g)
    assert expand("int{2..4}") == ["int2", "int3", "int4"]
    assert len(grid(["q4_0", "q4_0", "int{4,8}:g32"])) == 3  # duplicates dropped


_tokens = st.fixed_dictionaries({
    "bits": st.integers(2, 8), "group": st.sampled_from([8, 16, 32, 64, 128]),
    "axis": st.sampled_from(["tok", "chan", "head", "tensor"]), "sym": st.booleans(),
    "sd": st.sampled_from(["f16", "bf16", "f32", "e8m0"]), "rule": st.sampled_from(["absmax", "signed", "mse"]),
    "rnd": st.sampled_from(["even", "away", "up"]), "rot": st.booleans(), "recip": st.booleans(),
    "pack": st.sampled_from(["seq", "ggml"]),
})


@given(_tokens)
@settings(max_examples=300, deadline=None)
def test_random_spec_round_trip(t):
    parts = [f"int{t['bits']}"]
    parts += [f"g{t['group']}"] if t["axis"] == "tok" else ([f"g{t['group']}", "chan"] if t["axis"] == "chan" else [t["axis"]])
    parts += ["sym" if t["sym"] else "asym", f"s={t['sd']}", f"rule={t['rule']}", f"rnd={t['rnd']}", f"pack={t['pack']}"]
    parts += ["rot=had"] if t["rot"] else []
    parts += ["recip"] if t["recip"] else []
    text = ":".join(parts)
    try:
        spec = parse_spec(text)
    except ValueError as e:  # invalid combinations must say what is wrong
        assert any(w in str(e) for w in ("allowed", "needs", "cannot", "must", "applies")), str(e)
        return
    assert parse_spec(str(spec)) == spec
    assert KVQuantSpec.from_dict(spec.to_dict()) == spec
    assert kvlab.scheme(str(spec)).k == spec


@pytest.mark.parametrize("text,needle", [
    ("int9", "bits=9"), ("int1", "bits=1"), ("int4:g33", "group=33"), ("int4:g512", "group=512"),
    ("int4:g48:chan", "power of two"), ("foo", "unknown format"), ("int4:xx", "unknown token"),
    ("int4:s=f64", "s='f64'"), ("fp8_e4m3:asym", "asym"), ("bf16:g32", "unquantized"),
    ("int4:g32:asym:rule=signed", "signed"), ("int4:g32:asym:s=e8m0", "zero point"),
    ("int4:head:g32", "group size cannot"), ("nf4:rnd=away", "rounding"), ("int4:rule=unit", "unit"),
    ("fp4:g32:pack=ggml:chan", "pack ggml"), ("int4:g32:ts", "tensor_scale"),
])
def test_bad_spec_text(text, needle):
    with pytest.raises(ValueError, match=None) as e:
        parse_spec(text)
    assert needle in str(e.value)


@pytest.mark.parametrize("text,needle", [
    ("", "non-empty"), ("k=int4", "no V"), ("q4_0,window=-1", "window"), ("q4_0,window=abc", "window"),
    ("q4_0,bogus=3", "unknown scheme item"), ("int4:g32:prerope", "keys only"), ("q4_0,L0=bf16,L0=q8_0", None),
])
def test_bad_scheme_text(text, needle):
    if needle is None:  # a repeated layer key: last one wins in the text form, still a valid scheme
        assert kvlab.scheme(text).for_layer(0, 4)[0] == parse_spec("q8_0")
        return
    with pytest.raises(ValueError) as e:
        kvlab.scheme(text)
    assert needle in str(e.value)


def test_head_dim_checks():
    with pytest.raises(ValueError, match="does not divide head_dim 80"):
        parse_spec("int4:g32").check_head_dim(80)
    parse_spec("int4:g16").check_head_dim(80)
    parse_spec("int4:head").check_head_dim(96)


def test_spec_layer_imports_no_torch():
    import subprocess
    import sys
    code = "import sys, kvlab, kvlab.spec; kvlab.scheme('kivi4'); assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
