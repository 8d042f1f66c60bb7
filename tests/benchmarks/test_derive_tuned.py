"""A sibling GPU's packaged configs (`benchmarks/derive_tuned.py`): the base file's entries kept unless the heuristic
beat what they served by more than the slack, keys without an entry added only then, and runs from another GPU or
tuned file refused; the shipped H100 file is what the script derives from the committed runs."""
from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "sweeps/results/h100/runs/s31-decode-50963f6"
RUNS2 = ROOT / "sweeps/results/h100/runs/s32v-145fa37/b8_b16"
BASE = ROOT / "kvlab/kernels/data/tuned_nvidia_h200.json"
SHIPPED = ROOT / "kvlab/kernels/data/tuned_nvidia_h100_80gb_hbm3.json"


@pytest.fixture
def dt():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import derive_tuned
    return derive_tuned


def _row(scheme, dispatch, ms, cfg, batch=32):
    return dict(scheme=scheme, dispatch=dispatch, batch=str(batch), heads_q="32", heads_kv="8", head_dim="128",
                page_size="16", graph_ms=str(ms), config=json.dumps(cfg), error="")


def test_kept_within_slack_replaced_or_added_beyond(dt):
    from kvlab.kernels.tuned import attention_key
    specs = {"q4_0": "q4_0", "q8_0": "q8_0"}
    import kvlab
    key = lambda n, b: attention_key("decode", kvlab.scheme(n).k, kvlab.scheme(n).v, b, 32, 8, 128, 16)  # noqa: E731
    old = {"kernel": "gluon", "num_warps": 4, "tokens_per_warp": 16, "num_splits": 4, "ms": 0.40}
    base = {"format": 2, "configs": {key("q4_0", 32): old, key("q8_0", 32): old}}
    heur = {"version": 1, "kernel": "gluon", "num_warps": 4, "tokens_per_warp": 32, "num_splits": 5}
    rows = [_row("q4_0", "tuned", 0.50, old), _row("q4_0", "default", 0.48, heur),  # 4% faster: kept
            _row("q8_0", "tuned", 0.50, old), _row("q8_0", "default", 0.45, heur),  # 11%: replaced
            _row("q4_0", "tuned", 0.14, old, 8), _row("q4_0", "default", 0.12, heur, 8),  # no entry, 17%: added
            _row("q8_0", "tuned", 0.14, old, 8), _row("q8_0", "default", 0.139, heur, 8),  # no entry, within: none
            _row("q8_0", "tuned", 0.1, old, 1), {**_row("q8_0", "default", 0.01, heur, 1), "error": "gate"},
            _row("q4_0", "tuned", 0.10, old, 16), _row("q4_0", "default", 0.12, heur, 16)]  # no entry, base 17%: pinned
    configs, lines = dt.derive(base, rows, specs, 0.05)
    assert configs[key("q4_0", 32)] == old
    assert configs[key("q8_0", 32)] == {**heur, "ms": 0.45}
    assert configs[key("q4_0", 8)] == {**heur, "ms": 0.12}
    assert key("q8_0", 8) not in configs and key("q8_0", 1) not in configs
    assert configs[key("q4_0", 16)] == {**old, "ms": 0.10}
    assert [ln.split()[0] for ln in lines] == ["pinned", "kept", "added", "replaced", "none"]  # (sorted keys)
    assert base["configs"][key("q8_0", 32)] == old  # the base is not changed in place


def test_runs_from_another_gpu_or_tuned_file_are_refused(dt, tmp_path):
    run = tmp_path / "r"
    shutil.copytree(RUNS / "b32_b1", run)
    h = json.loads((run / "header.json").read_text())
    (run / "header.json").write_text(json.dumps({**h, "gpu": "NVIDIA A100-SXM4-80GB"}))
    with pytest.raises(SystemExit, match="A100"):
        dt.main(["--base", str(BASE), "--gpu", "NVIDIA H100 80GB HBM3", "--runs", str(run / "decode.csv"),
                 "--out", str(tmp_path / "o.json")])


def test_the_shipped_h100_file_is_the_derivation_of_the_committed_runs(dt, tmp_path, capsys):
    """Stage one: the H200 file checked on the H100 (session 31's runs); stage two: that file checked against the
    session-32 heuristic (8 warps at about one program an SM) on the same GPU."""
    stage1, out = tmp_path / "stage1.json", tmp_path / "h100.json"
    dt.main(["--base", str(BASE), "--gpu", "NVIDIA H100 80GB HBM3", "--runs",
             str(RUNS / "b32_b1/decode.csv"), str(RUNS / "b8_smollm2_d256/decode.csv"), "--out", str(stage1)])
    dt.main(["--base", str(stage1), "--gpu", "NVIDIA H100 80GB HBM3", "--pair", "default,heuristic", "--runs",
             str(RUNS2 / "decode.csv"), "--out", str(out)])
    got, shipped = json.loads(out.read_text()), json.loads(SHIPPED.read_text())
    assert got["configs"] == shipped["configs"] and got["gpu"] == shipped["gpu"] == "NVIDIA H100 80GB HBM3"
    with open(RUNS / "b32_b1/decode.csv") as f:
        assert {r["dispatch"] for r in csv.DictReader(f)} == {"tuned", "default"}


def test_stage_two_needs_the_measured_gpus_own_file(dt, tmp_path):
    """--pair default,heuristic: the base must be the packaged file of the GPU the runs measured."""
    with pytest.raises(SystemExit, match="packaged file of 'NVIDIA H100 80GB HBM3'"):
        dt.main(["--base", str(BASE), "--gpu", "NVIDIA H100 80GB HBM3", "--pair", "default,heuristic", "--runs",
                 str(RUNS2 / "decode.csv"), "--out", str(tmp_path / "o.json")])


def test_pair_picks_the_rows_compared(dt):
    from kvlab.kernels.tuned import attention_key
    import kvlab
    key = attention_key("decode", kvlab.scheme("q4_0").k, kvlab.scheme("q4_0").v, 32, 32, 8, 128, 16)
    old = {"kernel": "gluon", "num_warps": 4, "tokens_per_warp": 16, "num_splits": 4, "ms": 0.40}
    heur = {"version": 1, "kernel": "gluon", "num_warps": 8, "tokens_per_warp": 32, "num_splits": 1}
    rows = [_row("q4_0", "default", 0.50, old), _row("q4_0", "heuristic", 0.40, heur),
            _row("q4_0", "tuned", 0.30, old)]
    configs, _ = dt.derive({"configs": {key: old}}, rows, {"q4_0": "q4_0"}, 0.05, ("default", "heuristic"))
    assert configs[key] == {**heur, "ms": 0.40}
    configs, _ = dt.derive({"configs": {key: old}}, rows, {"q4_0": "q4_0"}, 0.05)  # tuned 0.30 vs default 0.50
    assert configs[key] == old


def test_runs_without_the_pair_are_refused(dt, tmp_path):
    """Stage two over runs that hold no default / heuristic pair (session 31's are tuned / default) derives nothing:
    refused by name rather than writing the base back unchanged."""
    stage1 = tmp_path / "stage1.json"
    dt.main(["--base", str(BASE), "--gpu", "NVIDIA H100 80GB HBM3", "--runs", str(RUNS / "b32_b1/decode.csv"),
             "--out", str(stage1)])
    with pytest.raises(SystemExit, match="no measured cell has both 'default' and 'heuristic'"):
        dt.main(["--base", str(stage1), "--gpu", "NVIDIA H100 80GB HBM3", "--pair", "default,heuristic", "--runs",
                 str(RUNS / "b32_b1/decode.csv"), "--out", str(tmp_path / "o.json")])
