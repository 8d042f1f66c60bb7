"""Merging a device run into a GPU's committed tables (`benchmarks/merge_results.py`): cells replace their committed
row in place, new cells append, rows without a value keep the committed one, the header keeps its history, and a run
from another GPU, with other columns or with a cell twice is refused before anything is written."""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COLS = ["scheme", "dispatch", "batch", "context", "heads_q", "heads_kv", "head_dim", "page_size", "graph_ms", "error"]
B32 = dict(dispatch="default", batch=32, context=32768, heads_q=32, heads_kv=8, head_dim=128, page_size=16)


@pytest.fixture(scope="module")
def mr():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import merge_results
    return merge_results


def _write(path: Path, rows: list[dict], cols=COLS, gpu="NVIDIA H200", commit="abc1234") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:   # the run's own writer: "\r\n" line ends, as benchmarks/run.py's
        w = csv.DictWriter(f, cols)
        w.writeheader()
        w.writerows({c: str(r.get(c, "")) for c in cols} for r in rows)
    (path.parent / ("header.json" if path.stem == "decode" else f"{path.stem}_header.json")).write_text(
        json.dumps({"gpu": gpu, "commit": commit}))
    return path


def _row(scheme, ms, **kw):
    return dict(B32, scheme=scheme, graph_ms=ms, **kw)


def _committed(tmp_path):
    into = tmp_path / "h200"
    _write(into / "decode.csv", [_row("bf16", 1.0), _row("q4_0", 0.5), _row("int2", 0.4)], commit="old0000")
    return into


def test_replace_in_place_append_and_keep(mr, tmp_path):
    into = _committed(tmp_path)
    run = tmp_path / "run"
    _write(run / "decode" / "decode.csv", [_row("q4_0", 0.3), _row("kivi4", 0.6), dict(_row("bf16", 0.9), batch="32.0")],
           commit="new1111")
    (line,) = mr.merge(run, into)
    assert "2 replaced, 1 added, 1 kept" in line
    text = (into / "decode.csv").read_text()
    assert "\r" not in text
    rows = list(csv.DictReader(text.splitlines()))
    assert [(r["scheme"], r["graph_ms"]) for r in rows] == [("bf16", "0.9"), ("q4_0", "0.3"), ("int2", "0.4"),
                                                             ("kivi4", "0.6")]
    head = json.loads((into / "header.json").read_text())
    assert head["commit"] == "new1111" and head["history"][0]["commit"] == "old0000"
    _write(run / "decode" / "decode.csv", [_row("int2", 0.35)], commit="new2222")
    mr.merge(run, into)
    head = json.loads((into / "header.json").read_text())
    assert [h["commit"] for h in head["history"]] == ["new1111", "old0000"]


def test_row_without_value_keeps_the_committed_one(mr, tmp_path):
    into = _committed(tmp_path)
    run = tmp_path / "run"
    _write(run / "decode.csv", [_row("q4_0", "", error="skipped: budget"), _row("int2", "nan", error="gate failed")])
    (line,) = mr.merge(run, into)
    assert "0 replaced" in line and "2 run rows without a value not merged" in line
    assert [r["graph_ms"] for r in csv.DictReader(open(into / "decode.csv"))] == ["1.0", "0.5", "0.4"]
    mr.merge(run, into, keep_empty=True)
    rows = list(csv.DictReader(open(into / "decode.csv")))
    assert [r["error"] for r in rows] == ["", "skipped: budget", "gate failed"]


def test_a_table_without_its_own_header_takes_the_folders_gpu(mr, tmp_path):
    """The folder's other headers name its GPU where a table has none of its own (the committed extend.csv): an H100
    run is refused there, an H200 run's extend rows merge and the table gets its header; a run's own
    `<kind>_header.json` is the one it keeps."""
    into = _committed(tmp_path)
    ext = ["scheme", "backend", "batch", "prefix", "chunk", "heads_q", "heads_kv", "head_dim", "page_size", "median_ms"]
    row = dict(scheme="q4_0", backend="auto_host", batch=1, prefix=8192, chunk=1024, heads_q=32, heads_kv=8,
               head_dim=128, page_size=16, median_ms=0.3)
    _write(into / "extend.csv", [row], cols=ext)
    (into / "extend_header.json").unlink()
    before = (into / "extend.csv").read_bytes()
    run = tmp_path / "run"
    _write(run / "extend.csv", [dict(row, median_ms=0.2)], cols=ext, gpu="NVIDIA H100 80GB HBM3")
    with pytest.raises(SystemExit, match="holds 'NVIDIA H200' rows"):
        mr.merge(run, into)
    assert (into / "extend.csv").read_bytes() == before and not (into / "extend_header.json").exists()
    _write(run / "extend.csv", [dict(row, median_ms=0.2)], cols=ext, commit="ext1234")
    (run / "header.json").write_text(json.dumps({"gpu": "NVIDIA H200", "commit": "dec9999"}))  # decode's, beside it
    (line,) = mr.merge(run, into)
    assert "1 replaced" in line
    assert json.loads((into / "extend_header.json").read_text())["commit"] == "ext1234"
    (into / "header.json").unlink()
    (into / "extend_header.json").unlink()
    with pytest.raises(SystemExit, match="no header in .* says which GPU"):
        mr.merge(run, into)


@pytest.mark.parametrize("case, message", [
    ("gpu", "ran on 'NVIDIA H100 80GB HBM3'"),
    ("columns", "lacks error"),
    ("twice", "appears twice"),
    ("nogpu", "says which GPU"),
])
def test_refused_before_anything_is_written(mr, tmp_path, case, message):
    into = _committed(tmp_path)
    before = {p.name: p.read_bytes() for p in into.iterdir()}
    run = tmp_path / "run"
    rows = [_row("q4_0", 0.3)]
    if case == "gpu":
        _write(run / "decode.csv", rows, gpu="NVIDIA H100 80GB HBM3")
    elif case == "columns":
        _write(run / "decode.csv", rows, cols=COLS[:-1])
    elif case == "twice":
        _write(run / "decode.csv", rows + [dict(_row("q4_0", 0.2), context="32768.0")])
    else:
        _write(run / "decode.csv", rows)
        (run / "header.json").unlink()
    # a good store table beside it must not be written either: the checks come before the first write
    _write(run / "store.csv", [dict(scheme="q4_0", tokens=32768, backend="triton", graph_ms=0.01)],
           cols=["scheme", "tokens", "backend", "graph_ms"])
    with pytest.raises(SystemExit, match=message):
        mr.merge(run, into)
    assert {p.name: p.read_bytes() for p in into.iterdir()} == before


def test_dry_run_and_missing_inputs(mr, tmp_path):
    into = _committed(tmp_path)
    before = (into / "decode.csv").read_bytes()
    run = tmp_path / "run"
    _write(run / "decode.csv", [_row("q4_0", 0.3)])
    (line,) = mr.merge(run, into, dry_run=True)
    assert "1 replaced" in line and (into / "decode.csv").read_bytes() == before
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no decode.csv"):
        mr.merge(tmp_path / "empty", into)
    with pytest.raises(SystemExit, match="is not one of"):
        mr.merge(run, into, tables=["prefill"])
    with pytest.raises(SystemExit, match="not a folder"):
        mr.merge(tmp_path / "nowhere", into)


def test_commit_column_filled_from_the_run_header_and_new_columns_on_request(mr, tmp_path):
    """A committed table mixing trees (a commit column, as store.csv / extend.csv) takes each run row's commit from
    the run's header; a column only the run has (store's gate_bytes) is refused unless --add-columns, which appends
    it, empty in the earlier rows; a header without a commit is refused where the table needs one."""
    cols = ["scheme", "tokens", "backend", "graph_ms", "commit"]
    into = tmp_path / "h200"
    _write(into / "store.csv", [dict(scheme="q4_0", tokens=32768, backend="triton", graph_ms=0.02, commit="old0000"),
                                dict(scheme="int2", tokens=32768, backend="triton", graph_ms=0.03, commit="old0000")],
           cols=cols)
    run = tmp_path / "run"
    run_cols = ["scheme", "tokens", "backend", "graph_ms", "gate_bytes"]
    _write(run / "store.csv", [dict(scheme="int2", tokens=32768, backend="triton", graph_ms=0.01, gate_bytes=0)],
           cols=run_cols, commit="new1111")
    before = (into / "store.csv").read_bytes()
    with pytest.raises(SystemExit, match="adds gate_bytes; --add-columns takes them"):
        mr.merge(run, into)
    assert (into / "store.csv").read_bytes() == before
    (line,) = mr.merge(run, into, add_columns=True)
    assert "1 replaced, 0 added, 1 kept" in line
    rows = list(csv.DictReader(open(into / "store.csv")))
    assert list(rows[0]) == cols + ["gate_bytes"]
    assert [(r["scheme"], r["commit"], r["gate_bytes"]) for r in rows] == [("q4_0", "old0000", ""),
                                                                           ("int2", "new1111", "0")]
    (run / "store_header.json").write_text(json.dumps({"gpu": "NVIDIA H200", "commit": "f" * 40}))
    mr.merge(run, into, add_columns=True)
    assert [r["commit"] for r in csv.DictReader(open(into / "store.csv"))] == ["old0000", "fffffff"]
    for head in ({"gpu": "NVIDIA H200"}, {"gpu": "NVIDIA H200", "commit": "unknown"}):
        (run / "store_header.json").write_text(json.dumps(head))
        with pytest.raises(SystemExit, match="names no commit"):
            mr.merge(run, into, add_columns=True)
