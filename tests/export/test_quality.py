"""Export speaks model quality: substitutes ranked by the real model's KL under the engine's profile (the
committed engine-options table), the exported option's cost stated in engine.json and the README."""
from __future__ import annotations

import json

import pytest

from kvlab.export import quality
from kvlab.export.engines import plan
from kvlab.export.substitute import nearest
from kvlab.spec import as_scheme


def _fake(kls: dict):
    rows = {p: {"profile": p, "kl": str(kl), "kl_sd": "0", "ppl_delta_pct": str(100 * kl), "ppl_delta_pct_sd": "0",
                "bits_per_element": "4.5", "model": "SmolLM2-135M-Instruct", "file": quality.OPTIONS}
            for p, kl in kls.items()}
    return lambda rel, key: rows if rel == quality.OPTIONS else {}


@pytest.mark.parametrize("best", ["q4_0", "iq4_nl"])
def test_substitute_is_the_lowest_kl_at_the_nearest_bits(monkeypatch, best):
    other = "iq4_nl" if best == "q4_0" else "q4_0"
    monkeypatch.setattr(quality, "_table", _fake({f"llama.cpp:{best}": 0.01, f"llama.cpp:{other}": 0.2}))
    sub = nearest(plan("llama.cpp", as_scheme("int4:g64:asym")), 128)  # 4.5 bits: q4_0 and iq4_nl are as near
    assert sub.label == best and sub.quality["chosen"]["kl"] == 0.01
    assert "KL 0.0100" in sub.message() and quality.OPTIONS in sub.message()
    assert sub.quality["requested"] is None and "pass --model" in sub.message()


def test_options_missing_from_the_table_fall_back_to_synthetic_error(monkeypatch):
    monkeypatch.setattr(quality, "_table", _fake({}))
    sub = nearest(plan("llama.cpp", as_scheme("int4:g64:asym")), 128)
    assert sub.quality["chosen"] is None and all(o["kl"] is None for o in sub.others)


def test_profile_names_of_engine_labels():
    assert quality.engine_profile("llama.cpp", "q4_0") == "llama.cpp:q4_0"
    assert quality.engine_profile("llama.cpp", "k=q8_0,v=q4_0") == "llama.cpp:q8_0/q4_0"
    assert quality.engine_profile("vllm", "fp8_e4m3") == "vllm:fp8_e4m3"
    assert quality.engine_profile("vllm", "auto (bf16)") is None and quality.engine_profile("json", "x") is None


def test_export_states_the_options_cost(tmp_path, monkeypatch):
    from kvlab.export import exporter
    monkeypatch.setattr(quality, "_table", _fake({"llama.cpp:q4_0": 0.0515}))
    info = exporter.export("q4_0", "llama.cpp", str(tmp_path / "x"), log=lambda m: None)
    assert info["quality"]["profile"] == "llama.cpp:q4_0" and info["quality"]["cost"]["kl"] == 0.0515
    assert json.load(open(tmp_path / "x" / "engine.json"))["quality"]["cost"]["kl"] == 0.0515
    assert "engine profile `llama.cpp:q4_0`" in (tmp_path / "x" / "README.md").read_text()
