"""Typed kernel configs, the tuned-config store (keys, JSON round trip, legacy files, export) and the
autotune driver's CPU behaviour and search spaces."""
import json

import pytest
import torch

import kvlab
from kvlab.kernels import autotune, configs, tuned
from kvlab.kernels.configs import (ExtendConfig, GluonDecodeConfig, StoreConfig, TritonDecodeConfig,
                                   config_from_dict)


@pytest.fixture
def tmp_cache(tmp_path):
    tuned.set_cache_path(str(tmp_path / "tuned.json"))
    yield tmp_path / "tuned.json"
    tuned.set_cache_path(None)


@pytest.mark.parametrize("cfg", [TritonDecodeConfig(block_n=128, num_splits=3, layout="rowfirst", maxnreg=168),
                                 GluonDecodeConfig(tokens_per_warp=32, maxnreg=168, transpose_o=False),
                                 ExtendConfig(block_m=32), StoreConfig(block_r=64, num_warps=8),
                                 StoreConfig(block_r=32, maxnreg=64)],
                         ids=lambda c: type(c).__name__)
def test_config_round_trips_through_its_dict(cfg):
    d = json.loads(json.dumps(cfg.to_dict()))
    assert d["version"] == configs.VERSION and d["kernel"] == cfg.kernel
    assert config_from_dict(cfg.op, d) == cfg


def test_legacy_dicts_of_older_tuned_files_read():
    old = {"BLOCK_N": 128, "asm": False, "num_splits": 8, "num_stages": 2, "num_warps": 4}
    assert config_from_dict("decode", old) == TritonDecodeConfig(block_n=128, asm=False, num_splits=8)
    old = {"kernel": "gluon", "maxnreg": 168, "num_splits": 3, "num_warps": 4, "tokens_per_warp": 32,
           "ot": False}
    assert config_from_dict("decode", old) == GluonDecodeConfig(tokens_per_warp=32, maxnreg=168, num_splits=3,
                                                                transpose_o=False)


@pytest.mark.parametrize("op,d,match", [
    ("decode", {"block_n": 48}, "block_n=48; allowed: a power of two"),
    ("decode", {"orient": "x"}, "orient='x'"),
    ("decode", {"orient": "kv", "dot": "fma"}, "does not combine"),
    ("decode", {"dot": "tf32"}, "dot='tf32'"),
    ("decode", {"layout": "colfirst"}, "layout"),
    ("decode", {"maxnreg": 16}, "maxnreg=16"),
    ("decode", {"kernel": "cuda"}, "config kernel='cuda' for 'decode'; allowed: 'triton', 'gluon'"),
    ("decode", {"kernel": "gluon", "tokens_per_warp": 8}, "tokens_per_warp=8"),
    ("decode", {"BLOCK_M": 64, "version": 1}, "unknown TritonDecodeConfig keys \\['BLOCK_M'\\]"),
    ("decode", {"version": 7}, "config version 7"),
    ("store", {"block_r": 3}, "block_r=3"),
    ("store", {"maxnreg": 300}, "maxnreg=300"),
    ("extend", TritonDecodeConfig(), "not a config for 'extend'"),
    ("decode", "fast", "must be a dict"),
])
def test_bad_configs_name_the_field_and_what_is_allowed(op, d, match):
    with pytest.raises(ValueError, match=match):
        config_from_dict(op, d)


def test_key_buckets_batch_and_ignores_context():
    s = kvlab.scheme("q4_0")
    k1 = tuned.attention_key("decode", s.k, s.v, 3, 32, 8, 128, 16)
    assert k1 == tuned.attention_key("decode", s.k, s.v, 4, 32, 8, 128, 16)
    assert k1 != tuned.attention_key("decode", s.k, s.v, 5, 32, 8, 128, 16)
    assert "int4" in k1 and "B4" in k1 and "P16" in k1
    assert tuned.store_key(s.k, 8, 128) == f"store|{s.k}|Hk8|D128|Tmax"


@pytest.mark.parametrize("tokens,bucket", [(1, "256"), (256, "256"), (257, "4096"), (517, "4096"), (4096, "4096"),
                                           (4097, "max"), (32768, "max")])
def test_store_key_buckets_the_written_tokens(tokens, bucket):
    """A store config is kept per written-token bucket: a first write of a few hundred tokens (a decode step, the
    benchmark's gate) must not choose the tiles of every later 32K-token prefill write (int2 ran at 0.35 of copy
    instead of 0.45 that way on the H200)."""
    s = kvlab.scheme("int2:g32:asym")
    assert tuned.store_key(s.k, 8, 128, tokens) == f"store|{s.k}|Hk8|D128|T{bucket}"


def test_store_looks_up_the_bucket_of_its_write(monkeypatch, tmp_cache):
    """kvlab.kernels.store asks the tuned store for its own write's bucket: a config recorded for small writes is not
    used for a large one, nor the reverse."""
    from kvlab.cache.layout import PageLayout
    from kvlab.kernels.store import api as store_api
    from kvlab.kernels.store import triton as store_triton
    s = kvlab.scheme("q4_0")
    tuned.record(tuned.store_key(s.k, 2, 64, 8), StoreConfig(block_r=8), 0.01)
    tuned.record(tuned.store_key(s.k, 2, 64, 5000), StoreConfig(block_r=32), 0.02)
    seen = []
    monkeypatch.setattr(store_triton, "run", lambda *a, config=None, **k: seen.append(config))
    monkeypatch.setattr(store_api, "can_launch", lambda x: True)
    for T, want in ((8, 8), (5000, 32), (300, None)):
        x = torch.zeros(T, 2, 64)
        pages = PageLayout(s.k, 64, 16, 2).allocate(-(-T // 16))
        store_api.store(x, pages, torch.arange(T), s.k, page_size=16, backend="triton")
        assert (seen[-1].block_r if seen[-1] else None) == want, T


def test_record_lookup_export(tmp_cache, tmp_path):
    s = kvlab.scheme("q8_0")
    cfg = TritonDecodeConfig(block_n=128, num_warps=8, num_splits=3, asm=False)
    key = tuned.attention_key("decode", s.k, s.v, 32, 32, 8, 128, 16)
    tuned.record(key, cfg, 0.5)
    tuned.record(tuned.store_key(s.k, 8, 128), StoreConfig(block_r=32), 0.03)
    tuned.set_cache_path(str(tmp_cache))  # re-read from disk
    assert tuned.lookup(tuned.attention_key("decode", s.k, s.v, 30, 32, 8, 128, 16)) == cfg
    assert tuned.measured_ms(key) == 0.5
    assert tuned.lookup(tuned.store_key(s.k, 8, 128)) == StoreConfig(block_r=32)
    assert tuned.lookup(tuned.attention_key("decode", s.k, s.v, 1, 32, 8, 128, 16)) is None
    data = json.load(open(tuned.export_configs(str(tmp_path / "export.json"))))
    assert data["format"] == tuned.FORMAT and "gpu" in data and len(data["configs"]) == 2


def test_legacy_tuned_file_is_read_and_unreadable_entries_are_skipped(tmp_cache):
    s = kvlab.scheme("q4_0")
    key = tuned.attention_key("decode", s.k, s.v, 32, 32, 8, 128, 16)
    bad = tuned.attention_key("decode", s.k, s.v, 1, 32, 8, 128, 16)
    tmp_cache.write_text(json.dumps({"gpu": "NVIDIA H200", "configs": {
        key: {"kernel": "gluon", "ms": 0.44, "num_splits": 3, "num_warps": 4, "tokens_per_warp": 32},
        bad: {"BLOCK_N": 100}}}))
    tuned.set_cache_path(str(tmp_cache))
    assert tuned.lookup(key) == GluonDecodeConfig(tokens_per_warp=32, num_splits=3)
    assert tuned.lookup(bad) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU tune() times candidates")
def test_tune_on_cpu_returns_default_without_timing(tmp_cache):
    cfg, ms = kvlab.kernels.tune("decode", "q4_0", {"batch": 2, "heads_q": 8, "heads_kv": 2, "head_dim": 64,
                                                    "page_size": 16})
    assert ms is None and isinstance(cfg, TritonDecodeConfig) and cfg.num_splits >= 1
    assert kvlab.kernels.tune("store", "q4_0", {"batch": 1, "heads_q": 8, "heads_kv": 2, "head_dim": 64,
                                                "page_size": 16}) == (StoreConfig(), None)
    with pytest.raises(ValueError, match="op"):
        autotune.tune("prefill", "q4_0", {"batch": 1, "heads_q": 8, "heads_kv": 2, "head_dim": 64, "page_size": 16})


def test_auto_splits_fill_the_machine():
    assert configs.auto_splits(1, 8) >= configs.auto_splits(32, 8) >= 1
    assert configs.auto_splits(10_000, 8) == 1


def test_split_space_steps_around_the_best(monkeypatch):
    monkeypatch.setattr(autotune, "num_sms", lambda device=None: 132)
    got = [c.num_splits for c in autotune.split_space(TritonDecodeConfig(num_splits=4), 1, 8)]
    assert got == [2, 3, 6, 8]  # B * Hk = 8 programs cannot fill 132 SMs without splitting: no 1


def test_split_space_offers_one_split_when_the_grid_fills_the_gpu(monkeypatch):
    monkeypatch.setattr(autotune, "num_sms", lambda device=None: 132)
    got = autotune.split_space(GluonDecodeConfig(num_splits=2), 32, 8)
    assert [c.num_splits for c in got] == [1, 3, 4, 2] and all(isinstance(c, GluonDecodeConfig) for c in got)
    assert [c.fused_merge for c in got] == [False, False, False, True]  # the best's splits, merged in one launch
    assert not any(c.fused_merge for c in autotune.split_space(GluonDecodeConfig(num_splits=1), 32, 8))


@pytest.mark.parametrize("name", ["q4_0", "q8_0", "fp8_e4m3", "int4_had", "kivi4", "int3:g32:asym"])
def test_triton_space_offers_the_fast_paths_the_spec_has(name):
    sch = kvlab.scheme(name)
    cands = autotune.triton_space(32, 8, sch.k, sch.v)
    assert len(set(cands)) == len(cands) and all(c.num_splits for c in cands)
    quant4 = any(s.fmt == "int" and s.bits == 4 and s.axis != "chan" for s in (sch.k, sch.v))
    assert any(c.asm for c in cands) == (quant4 or any(autotune.rowfirst_ok(s) for s in (sch.k, sch.v)))
    assert any(c.orient == "kv" for c in cands) == quant4


# ---- configs shipped with the package ---------------------------------------------------------------
def _packaged(monkeypatch, tmp_path, configs: dict, gpu="NVIDIA H200"):
    """A packaged file for `gpu` in a temporary data dir, and that GPU as the current one."""
    import json
    d = tmp_path / "data"
    d.mkdir()
    (d / "tuned_nvidia_h200.json").write_text(json.dumps({"format": 2, "gpu": gpu, "configs": configs}))
    monkeypatch.setattr(tuned, "DATA_DIR", str(d))
    monkeypatch.setattr(tuned, "gpu_name", lambda device=None: gpu)
    tuned.set_cache_path(str(tmp_path / "user.json"))  # an empty user file; clears the caches


def test_packaged_configs_serve_a_new_user_and_the_users_own_override(tmp_cache, tmp_path, monkeypatch):
    key = tuned.attention_key("decode", "q4_0", "q4_0", 32, 32, 8, 128, 16)
    _packaged(monkeypatch, tmp_path, {key: {"kernel": "gluon", "num_warps": 4, "tokens_per_warp": 32,
                                            "num_splits": 3, "ms": 0.44}})
    got = tuned.lookup(key)
    assert got == GluonDecodeConfig(num_warps=4, tokens_per_warp=32, num_splits=3)
    assert tuned.lookup(key, packaged=False) is None and tuned.measured_ms(key) is None  # tune() compares its own
    assert tuned.measured_ms(key, packaged=True) == 0.44
    mine = TritonDecodeConfig(block_n=128, num_splits=5)
    tuned.record(key, mine, 0.5, save=False)
    assert tuned.lookup(key) == mine  # the user's tune() result wins over the shipped one
    monkeypatch.setenv("KVLAB_PACKAGED_CONFIGS", "0")
    tuned.set_cache_path(str(tmp_path / "other.json"))
    assert tuned.lookup(key) is None


def test_nearest_bucket_serves_untuned_batches_with_splits_rederived(tmp_cache, tmp_path, monkeypatch):
    k32 = tuned.attention_key("decode", "q8_0", "q8_0", 32, 32, 8, 128, 16)
    _packaged(monkeypatch, tmp_path, {k32: {"kernel": "gluon", "num_warps": 4, "tokens_per_warp": 32,
                                            "num_splits": 1}})
    k1 = tuned.attention_key("decode", "q8_0", "q8_0", 1, 32, 8, 128, 16)
    assert tuned.lookup(k1) is None
    assert tuned.nearest(k1) == GluonDecodeConfig(num_warps=4, tokens_per_warp=32, num_splits=None)
    other_shape = tuned.attention_key("decode", "q8_0", "q8_0", 1, 9, 3, 64, 16)
    assert tuned.nearest(other_shape) is None  # never borrowed across heads, head_dim or page size
    assert tuned.nearest("store|q4_0|Hk8|D128") is None


def test_decode_dispatch_falls_back_to_a_kernel_that_runs_the_call(tmp_cache, tmp_path, monkeypatch):
    """On the CPU a shipped Gluon entry cannot run (it needs CUDA): dispatch falls through to Triton."""
    from kvlab.kernels.env import interpreting
    if not interpreting():
        pytest.skip("CPU tensors reach the Triton kernels only under TRITON_INTERPRET=1 (CPU CI)")
    import torch

    import sys
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent / "decode"))
    from paged_cases import call_args, make_paged

    from kvlab.kernels.checks import check_prefix
    from kvlab.kernels.decode import api
    spec = kvlab.scheme("q4_0").k
    c = make_paged([5, 40], 2, 128, 16, spec, spec)
    q = torch.randn(2, 4, 128)
    args, kw = call_args(c)
    kv = check_prefix(q, *args, spec, spec, 16, *kw.values(), 2)
    key = tuned.attention_key("decode", spec, spec, 2, 4, 2, 128, 16)
    _packaged(monkeypatch, tmp_path, {key: {"kernel": "gluon", "num_warps": 4, "tokens_per_warp": 32,
                                            "num_splits": 2}})
    mod, cfg = api.resolve(q, kv)
    assert cfg.kernel == "triton" and mod.__name__.endswith("decode.triton")


def test_every_shipped_config_parses():
    """A shipped entry this kvlab cannot read would be skipped silently: every one must parse."""
    import pathlib
    for path in pathlib.Path(tuned.DATA_DIR).glob("tuned_*.json"):
        entries = json.loads(path.read_text())["configs"]
        assert entries, path
        for key, e in entries.items():
            configs.config_from_dict(key.split("|", 1)[0], {k: v for k, v in e.items() if k != "ms"})
