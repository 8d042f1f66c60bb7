"""Sweep: config validation, cell ids, journal durability, resume after a kill, Ray == local, report."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from kvlab.sweep import expand_cells, load_config, parse_config
from kvlab.sweep.__main__ import main
from kvlab.sweep.pareto import dominates, frontier
from kvlab.sweep.results import VOLATILE, SweepResults

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"name": "small", "seed": 0, "schemes": ["q4_0", "q8_0", "int{2,3}:g32:asym", "kivi4"],
         "stages": {"roundtrip": {"distributions": ["student_t4", "laplace"], "tokens": 512, "head_dim": 64},
                    "speed": {}}}


def _write(tmp_path, cfg) -> str:
    p = tmp_path / "sweep.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return str(p)


def test_default_config_is_valid_and_big_enough():
    cfg = load_config(str(ROOT / "kvlab" / "sweep" / "default.yaml"))
    names = {s.name for s in cfg.schemes}
    from kvlab.spec import ALL_PRESETS
    assert set(ALL_PRESETS) <= names and len(cfg.schemes) >= 30
    gpu = cfg.for_device("cuda")
    assert len(gpu.schemes) >= 100 and "speed" in gpu.stages


@pytest.mark.parametrize("mutate,needle", [
    (lambda c: c.update(bogus=1), "bogus: unknown key"),
    (lambda c: c.update(name="a b"), "name:"),
    (lambda c: c["stages"].update(warp={}), "stages.warp: unknown stage"),
    (lambda c: c["stages"]["roundtrip"].update(tokenz=3), "stages.roundtrip.tokenz: unknown key"),
    (lambda c: c["stages"]["roundtrip"].update(tokens="many"), "stages.roundtrip.tokens: must be int"),
    (lambda c: c["stages"]["roundtrip"].update(distributions=["cauchy"]), "unknown 'cauchy'"),
    (lambda c: c.update(schemes=["int9"]), "schemes[0]"),
    (lambda c: c.update(schemes=[]), "schemes: must be a non-empty list"),
    (lambda c: c["stages"].update(speed={"shapes": [{"batch": 1}]}), "stages.speed.shapes[0]"),
    (lambda c: c.update(device="tpu"), "device: allowed"),
])
def test_bad_config(mutate, needle):
    cfg = json.loads(json.dumps(SMALL))
    mutate(cfg)
    with pytest.raises(ValueError) as e:
        parse_config(cfg)
    assert needle in str(e.value)


def test_bad_yaml_file(tmp_path, capsys):
    p = tmp_path / "bad.yaml"
    p.write_text("name: [unclosed\n")
    assert main([str(p), "--out", str(tmp_path / "o")]) == 2
    assert "not valid YAML" in capsys.readouterr().err
    assert main([str(tmp_path / "missing.yaml")]) == 2


def test_cell_ids_are_stable_and_unique():
    cfg = parse_config(SMALL)
    a, b = expand_cells(cfg), expand_cells(parse_config(SMALL))
    assert [c.id for c in a] == [c.id for c in b]
    assert len({c.id for c in a}) == len(a) == 5 * 2 + 5  # 5 schemes x 2 distributions + 5 speed cells


def test_speed_on_cpu_is_a_reported_skip(tmp_path):
    out = tmp_path / "o"
    assert main([_write(tmp_path, SMALL), "--out", str(out), "--quiet", "--device", "cpu"]) == 0
    df = pd.read_parquet(out / "results.parquet")
    sp = df[df["stage"] == "speed"]
    assert len(sp) == 5 and sp["status"].str.startswith("skipped: the speed stage needs a CUDA GPU").all()
    assert (df[df["stage"] == "roundtrip"]["status"] == "ok").all()
    assert {"commit", "device_name", "torch", "triton", "date", "seed"} <= set(df.columns)
    assert (out / "pareto.csv").exists() and (out / "pareto.png").exists()
    assert main([_write(tmp_path, SMALL), "--out", str(out), "--quiet"]) == 2  # refuses to mix without --resume


def _stable(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=[c for c in VOLATILE if c in df.columns]).reset_index(drop=True)


def test_killed_then_resumed_equals_uninterrupted(tmp_path):
    cfg = {**SMALL, "stages": {"roundtrip": {"distributions": ["student_t4", "laplace", "outlier_channels"],
                                             "tokens": 2048, "head_dim": 64}}}
    path = _write(tmp_path, cfg)
    full = tmp_path / "full"
    assert main([path, "--out", str(full), "--quiet"]) == 0
    part = tmp_path / "part"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "kvlab.sweep", path, "--out", str(part), "--quiet"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    journal = part / "cells.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and (not journal.exists() or len(journal.read_text().splitlines()) < 3):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    n_before = len(SweepResults(part).rows())
    assert 3 <= n_before < 15, n_before
    with open(journal, "a") as f:  # a torn line, as if killed mid-write
        f.write('{"cell_id": "abc", "ind')
    assert main([path, "--out", str(part), "--quiet", "--resume"]) == 0
    pd.testing.assert_frame_equal(_stable(pd.read_parquet(part / "results.parquet")),
                                  _stable(pd.read_parquet(full / "results.parquet")))


def test_ray_executor_equals_local(tmp_path):
    pytest.importorskip("ray")
    cfg = {**SMALL, "schemes": ["q4_0", "int3:g32:asym"], "stages": {"roundtrip": SMALL["stages"]["roundtrip"]}}
    path = _write(tmp_path, cfg)
    assert main([path, "--out", str(tmp_path / "local"), "--quiet"]) == 0
    assert main([path, "--out", str(tmp_path / "ray"), "--quiet", "--executor", "ray"]) == 0
    pd.testing.assert_frame_equal(_stable(pd.read_parquet(tmp_path / "ray" / "results.parquet")),
                                  _stable(pd.read_parquet(tmp_path / "local" / "results.parquet")))


def test_pareto_respects_spread():
    t = pd.DataFrame([
        {"scheme": "a", "name": "a", "bits": 4, "eff_bits": 4.0, "loss": 0.10, "loss_sd": 0.01, "loss_metric": "kl", "decode_ms": float("nan")},
        {"scheme": "b", "name": "b", "bits": 4, "eff_bits": 4.0, "loss": 0.105, "loss_sd": 0.01, "loss_metric": "kl", "decode_ms": float("nan")},
        {"scheme": "c", "name": "c", "bits": 5, "eff_bits": 5.0, "loss": 0.2, "loss_sd": 0.0, "loss_metric": "kl", "decode_ms": float("nan")},
        {"scheme": "d", "name": "d", "bits": 8, "eff_bits": 8.0, "loss": 0.01, "loss_sd": 0.0, "loss_metric": "kl", "decode_ms": float("nan")},
    ])
    assert not dominates(t.iloc[0], t.iloc[1]) and not dominates(t.iloc[1], t.iloc[0])  # inside the noise
    assert dominates(t.iloc[0], t.iloc[2])
    assert set(frontier(t)["scheme"]) == {"a", "b", "d"}


def test_report_command(tmp_path, capsys):
    out = tmp_path / "o"
    cfg = {**SMALL, "stages": {"roundtrip": SMALL["stages"]["roundtrip"]}}
    assert main([_write(tmp_path, cfg), "--out", str(out), "--quiet"]) == 0
    (out / "pareto.csv").unlink()
    assert main(["report", str(out)]) == 0
    assert (out / "pareto.csv").exists() and "scheme" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "nothing")]) == 2


def test_worker_processes_equal_sequential(tmp_path):
    cfg = {**SMALL, "schemes": ["q4_0", "nvfp4", "int3:g32:asym:rot=had"],
           "stages": {"roundtrip": SMALL["stages"]["roundtrip"]}}
    path = _write(tmp_path, cfg)
    assert main([path, "--out", str(tmp_path / "seq"), "--quiet"]) == 0
    assert main([path, "--out", str(tmp_path / "par"), "--quiet", "--workers", "2"]) == 0
    pd.testing.assert_frame_equal(_stable(pd.read_parquet(tmp_path / "par" / "results.parquet")),
                                  _stable(pd.read_parquet(tmp_path / "seq" / "results.parquet")))


def test_timed_cell_runs_where_stderr_has_no_file(monkeypatch):
    """The speed-cell watchdog (faulthandler) needs a real file; where stderr has none (notebooks,
    captured output) the cell still runs instead of the sweep aborting."""
    import io

    from kvlab.sweep import executors
    cell = next(c for c in expand_cells(parse_config(SMALL)) if c.stage == "speed").to_dict()
    monkeypatch.setattr(sys, "__stderr__", io.StringIO())
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    row = executors._timed(cell, "cpu")
    assert row["status"].startswith("skipped: the speed stage needs a CUDA GPU")
    assert executors._timed(cell, "cpu", report_after_s=30)["cell_id"] == cell["cell_id"]


@pytest.mark.parametrize("name", ["q4_0", "int4_had", "nvfp4", "fp8_e4m3", "int3:g32:asym"])
def test_speed_store_closure_writes_through_the_public_store(name):
    """The speed stage times the public store op (what a user gets): its closure writes the bytes the
    reference store writes for the same tokens, and counts the bf16 input plus every page tensor."""
    import kvlab
    from kvlab.kernels.store import store
    from kvlab.sweep.speed import _store_fn
    sch = kvlab.scheme(name)
    fn = _store_fn(sch, {"context": 64, "heads_kv": 2, "head_dim": 64, "page_size": 16}, device="cpu")
    fn()
    want = {k: (None if v is None else torch.zeros_like(v)) for k, v in fn.pages.items()}
    kw = {"tensor_scale": 1.0} if sch.k.tensor_scale else {}
    if sch.k.static_scale:
        kw["scale"] = 1.0
    store(fn.x, want, torch.arange(64), sch.k, backend="reference", **kw)
    for k, v in want.items():
        if v is not None:
            assert torch.equal(fn.pages[k].view(torch.uint8), v.view(torch.uint8)), k
    assert fn.bytes == fn.x.numel() * 2 + sum(v.numel() * v.element_size() for v in want.values() if v is not None)


def test_pareto_recounts_effective_bits_of_older_rows():
    """Rows stored under an older count (a window that absorbed the unfinished channel group) are recounted from the
    scheme text and the cell's token count: window + Gc - 1 bf16 tokens at worst; unknown models with overrides keep
    the stored value."""
    import kvlab
    from kvlab.sweep.pareto import _amortized
    sch = kvlab.scheme("kivi4")  # window 128, channel groups of 32
    q = sch.bits_per_element(64)
    params = json.dumps({"model": "smollm2", "tokens": 2048})
    got = _amortized("kivi4", q, params, stored=(128 * 16 + 1920 * q) / 2048)  # the old count
    assert got == pytest.approx((159 * 16 + 1889 * q) / 2048)
    over = "q4_0,L0=int4:g32:chan:asym|int4:g32:asym"
    b = kvlab.scheme(over).bits_per_element(64)
    assert _amortized(over, b, params) == pytest.approx(
        kvlab.scheme(over).bits_per_element(64, context=2048, n_layers=30))
    assert _amortized(over, b, json.dumps({"model": "other", "tokens": 2048}), stored=4.75) == 4.75
