"""Tuned-config cache: keys, JSON round trip, export, CPU default from tune()."""
import json

import pytest

import kvlab
from kvlab.kernels import tuning


@pytest.fixture
def tmp_cache(tmp_path):
    tuning.set_cache_path(str(tmp_path / "tuned.json"))
    yield tmp_path / "tuned.json"
    tuning.set_cache_path(None)


def test_key_buckets_batch_and_ignores_context():
    s = kvlab.scheme("q4_0")
    k1 = tuning.key("decode", s.k, s.v, 3, 32, 8, 128, 16)
    assert k1 == tuning.key("decode", s.k, s.v, 4, 32, 8, 128, 16)
    assert k1 != tuning.key("decode", s.k, s.v, 5, 32, 8, 128, 16)
    assert "int4" in k1 and "B4" in k1 and "P16" in k1


def test_record_lookup_export(tmp_cache, tmp_path):
    s = kvlab.scheme("q8_0")
    cfg = {"BLOCK_N": 128, "num_warps": 8, "num_stages": 2, "num_splits": 3, "asm": False}
    tuning.record("decode", s.k, s.v, 32, 32, 8, 128, 16, cfg, 0.5)
    tuning.set_cache_path(str(tmp_cache))  # re-read from disk
    got = tuning.lookup("decode", s.k, s.v, 30, 32, 8, 128, 16)
    assert got["BLOCK_N"] == 128 and got["ms"] == 0.5
    assert tuning.lookup("decode", s.k, s.v, 1, 32, 8, 128, 16) is None
    out = tuning.export_configs(str(tmp_path / "export.json"))
    data = json.load(open(out))
    assert "gpu" in data and len(data["configs"]) == 1


def test_tune_on_cpu_returns_default_without_timing(tmp_cache):
    cfg, ms = kvlab.kernels.tune("decode", "q4_0", {"batch": 2, "heads_q": 8, "heads_kv": 2, "head_dim": 64,
                                                    "page_size": 16})
    assert ms is None and cfg["BLOCK_N"] > 0 and cfg["num_splits"] >= 1
    with pytest.raises(ValueError, match="op"):
        tuning.tune("prefill", "q4_0", {"batch": 1, "heads_q": 8, "heads_kv": 2, "head_dim": 64, "page_size": 16})


def test_auto_splits_fill_the_machine():
    assert tuning.auto_splits(1, 8) >= tuning.auto_splits(32, 8) >= 1
    assert tuning.auto_splits(10_000, 8) == 1


def test_split_space_steps_around_the_best(monkeypatch):
    monkeypatch.setattr(tuning, "num_sms", lambda device=None: 132)
    got = [c["num_splits"] for c in tuning.split_space({"num_splits": 4, "BLOCK_N": 64}, 1, 8)]
    assert got == [2, 3, 6, 8]  # B * Hk = 8 programs cannot fill 132 SMs without splitting: no 1


def test_split_space_offers_one_split_when_the_grid_fills_the_gpu(monkeypatch):
    monkeypatch.setattr(tuning, "num_sms", lambda device=None: 132)
    got = [c["num_splits"] for c in tuning.split_space({"num_splits": 2, "kernel": "gluon"}, 32, 8)]
    assert got == [1, 3, 4]
    assert all(c["kernel"] == "gluon" for c in tuning.split_space({"num_splits": 2, "kernel": "gluon"}, 32, 8))
