"""Issues 16 / 17's target table (`benchmarks/targets.py`): which cells a decode / store / extend table gives, pass and
miss at the bounds, the untuned-over-tuned ratio, the limits join, and clear errors for missing inputs."""
from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tg():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import targets
    return targets


DEC_COLS = ["scheme", "dispatch", "batch", "context", "heads_q", "heads_kv", "head_dim", "page_size", "graph_ms",
            "roofline_frac_graph", "ratio_graph_vs_cudnn", "error"]
B32 = dict(batch=32, context=32768, heads_q=32, heads_kv=8, head_dim=128, page_size=16)
B1 = dict(B32, batch=1)


def _dec(scheme, dispatch, shape, ms, frac, ratio="", error=""):
    return dict(shape, scheme=scheme, dispatch=dispatch, graph_ms=ms, roofline_frac_graph=frac,
                ratio_graph_vs_cudnn=ratio, error=error)


def _write(path: Path, cols: list[str], rows: list[dict]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, cols)
        w.writeheader()
        w.writerows({k: str(v) for k, v in r.items()} for r in rows)
    return path


def _decode_file(tmp_path, rows):
    return _write(tmp_path / "decode.csv", DEC_COLS, [{c: r.get(c, "") for c in DEC_COLS} for r in rows])


def test_decode_cells_pass_and_miss_at_the_bounds(tg, tmp_path):
    rows = [_dec("q4_0", "default", B32, 0.45, 0.85, 0.36), _dec("kivi4", "default", B32, 0.52, 0.849, 0.401),
            _dec("q4_0", "heuristic", B32, 0.4949, 0.8), _dec("kivi4", "heuristic", B32, 0.5721, 0.7),
            _dec("int2", "default", B1, 0.02, 0.6, error="flash: no kernel; "),  # a peer's error, the row timed
            _dec("nf4", "default", B1, "", "", error="skipped: time budget"),
            _dec("lm3", "default", B32, 0.8, 0.3)]  # lm3: not one of issue 16's schemes
    cells = tg.decode_cells(list(csv.DictReader(open(_decode_file(tmp_path, rows)))))
    got = {(c.check, c.scheme): c.ok for c in cells}
    assert got[("decode b32 roofline", "q4_0")] is True         # 0.85 meets >= 0.85
    assert got[("decode b32 roofline", "kivi4")] is False
    assert got[("decode b32 x cuDNN", "q4_0")] is True          # 0.36 meets <= 0.36
    assert got[("decode b32 x cuDNN", "kivi4")] is False        # 0.401 > 0.40
    assert got[("decode b32 untuned / tuned", "q4_0")] is True  # 0.4949 / 0.45 < 1.10
    assert got[("decode b32 untuned / tuned", "kivi4")] is False
    assert got[("decode b1 roofline", "int2")] is True          # the value decides, not the error text
    assert got[("decode b1 roofline", "nf4")] is None           # skipped: no value
    assert got[("decode b32 roofline", "bf16")] is None         # no row at a shape the table has
    # every issue-16 scheme has a cell at each shape the table holds; none at a shape it lacks; never lm3
    for shape in ("b32", "b1"):
        assert {s for (chk, s) in got if chk == f"decode {shape} roofline"} == set(limits_mod().DECODE_SCHEMES)
    assert not any(chk.startswith("decode smollm2") or chk.startswith("decode d256") for chk, _ in got)
    assert not any(s == "lm3" for _, s in got)


def limits_mod():
    import limits
    return limits


def test_xqa_cell_divides_the_two_ratios_to_cudnn(tg, tmp_path):
    dec = list(csv.DictReader(open(_decode_file(tmp_path, [_dec("fp8_e4m3", "default", B1, 0.027, 0.7, 0.72)]))))
    peer = dict(test="timing", batch="1", context="32768", heads_q="32", heads_kv="8", head_dim="128")
    rows = [dict(peer, impl="kvlab", ratio_vs_cudnn="1.35"), dict(peer, impl="xqa", ratio_vs_cudnn="1.2"),
            dict(peer, impl="xqa", heads_q="64", ratio_vs_cudnn="0.1")]  # another shape's row is not read
    (cell,) = tg.peer_cells(rows, dec)
    assert cell.value == pytest.approx(0.72 / 1.2) and cell.ok is True
    assert tg.peer_cells(rows, []) == []  # no fp8 B 1 row: no cell


def test_store_and_extend_cells(tg):
    store = [dict(scheme="q4_0", backend="triton", fraction_of_copy="0.61"),
             dict(scheme="int4_had", backend="triton_prerotated", fraction_of_copy="0.9"),
             dict(scheme="int4_had", backend="triton", fraction_of_copy="0.59")]
    got = {c.scheme: c.ok for c in tg.store_cells(store)}
    assert got["q4_0"] is True and got["int4_had"] is False      # the pre-rotated comparison is not the store's row
    assert got["kivi4"] is None                                  # every scheme has a cell; no row, no value
    ext = dict(batch="1", prefix="8192", chunk="1024", heads_q="32", heads_kv="8", head_dim="128")
    rows = [dict(ext, scheme="bf16", backend="auto_host", ratio_vs_cudnn="1.15"),
            dict(ext, scheme="q4_0", backend="auto_host", ratio_vs_cudnn="1.15"),
            dict(ext, scheme="q4_0", backend="auto_host_eager", ratio_vs_cudnn="3.0")]
    rows.append(dict(ext, head_dim="256", heads_q="8", heads_kv="4", scheme="q4_0", backend="auto_host",
                     ratio_vs_cudnn="1.3"))
    got = {(c.check, c.scheme): (c.ok, c.target) for c in tg.extend_cells(rows)}
    assert got[("extend p8k_b1 x cuDNN", "bf16")] == (False, 1.1)
    assert got[("extend p8k_b1 x cuDNN", "q4_0")] == (True, 1.2)    # the eager row is not the one a prefill replays
    assert got[("extend p8k_b1 x cuDNN", "kivi4")] == (None, 1.2)
    assert got[("extend d256_p8k x cuDNN (extra)", "q4_0")] == (False, 1.2)  # beyond issue 17's shapes: an extra
    assert not any(k[0].startswith("extend p32k") for k in got)       # a shape the table lacks has no cells


def test_report_joins_the_limits_summary_to_the_misses(tg, tmp_path):
    d = tmp_path / "run"
    (d / "decode").mkdir(parents=True)
    _write(d / "decode" / "decode.csv", DEC_COLS, [{c: r.get(c, "") for c in DEC_COLS} for r in
                                                  [_dec("int2", "default", B32, 0.4, 0.7, 0.27)]])
    lim = _write(tmp_path / "limits.csv", ["case", "limiter", "issue_pct", "dram_pct", "top_stalls"],
                 [dict(case="decode:b32:int2", limiter="instruction issue", issue_pct=81, dram_pct=55, top_stalls="x")])
    text = tg.main(["--results", str(d), "--limits", str(lim)])
    assert "| 16 | decode b32 roofline (>= 0.85) | 0 / 1 | int2 0.7 | bf16, fp8_e4m3," in text
    assert "| 16 | decode b32 x cuDNN (<= 0.25; q4_0 0.36; kivi4 0.4) | 0 / 1 | int2 0.27 |" in text
    assert "| decode b32 roofline | decode:b32:int2 | 0.7 | 0.85 |  | instruction issue | 81 | 55 | x |" in text
    assert f"limits `{lim}`" in text


def test_committed_h200_tables_give_every_scheme_a_cell(tg):
    import limits
    import run
    text = tg.main([])
    for check in ("decode b32 roofline", "decode b1 roofline", "store 32k of copy", "extend p8k_b1 x cuDNN"):
        assert f"| {check} (" in text
    cells = tg.decode_cells(list(csv.DictReader(open(limits.RESULTS / "decode.csv"))))
    assert {c.scheme for c in cells if c.check == "decode b32 roofline"} == set(limits.DECODE_SCHEMES)
    store = tg.store_cells(list(csv.DictReader(open(limits.RESULTS / "store.csv"))))
    assert [c.scheme for c in store] == list(run.SCHEMES)


def test_bad_inputs_name_what_is_wrong(tg, tmp_path):
    with pytest.raises(SystemExit, match="not a folder"):
        tg.main(["--results", str(tmp_path / "nope")])
    with pytest.raises(SystemExit, match="no decode.csv"):
        tg.main(["--results", str(tmp_path)])
    with pytest.raises(SystemExit, match="--decode .*: no such file"):
        tg.main(["--results", str(tmp_path), "--decode", str(tmp_path / "x.csv")])
    (tmp_path / "store.csv").write_text("scheme,backend,fraction_of_copy\nq4_0,triton,0.7\n")
    with pytest.raises(SystemExit, match="--limits .*: no such file"):
        tg.main(["--results", str(tmp_path), "--limits", str(tmp_path / "l.csv")])
    (tmp_path / "old.csv").write_text("scheme,batch,median_ms\nq4_0,32,0.4\n")  # an old table without dispatch
    with pytest.raises(SystemExit, match="not a decode table .*no column dispatch"):
        tg.main(["--decode", str(tmp_path / "old.csv")])
    for sub in ("a", "b"):  # two decode tables one folder down: which one is ambiguous
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "decode.csv").write_text(",".join(DEC_COLS) + "\n")
    with pytest.raises(SystemExit, match="2 files named decode.csv .* --decode"):
        tg.main(["--results", str(tmp_path)])


def test_a_table_named_directly_reads_no_other(tg, tmp_path):
    text = tg.main(["--decode", str(_decode_file(tmp_path, [_dec("q4_0", "default", B32, 0.45, 0.9, 0.33)]))])
    assert "store" not in text and "extend" not in text and "XQA" not in text
