"""The profile summary behind issues 16 / 17's "what limits each scheme that misses" (`benchmarks/limits.py`): the
cases a table's misses give, ncu's CSV read back into cases through the marker kernels, the limiter rule, and the
driver itself on tiny CPU shapes (the GPU run is `bash benchmarks/h200_run.sh limits`)."""
from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "sweeps/results/h200/runs/gluon-136a776/ncu_q4_0_gluon.csv"  # a real ncu --csv --page details file
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (the interpreter evaluates both sides of a where)


@pytest.fixture
def lim():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import limits
    return limits


HEAD = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size", "Grid Size",
        "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]


def _rows(kid: int, name: str, grid: str, metrics: dict) -> list[list[str]]:
    return [[str(kid), "1", "python3", "h", name, "1", "7", "(128, 1, 1)", grid, "0", "9.0", "s", k, u, v]
            for k, (u, v) in metrics.items()]


def _write(path: Path, kernels: list[tuple[str, str, dict]], real: Path | None = None, real_at: int | None = None):
    """An ncu CSV of `kernels` (name, grid, {metric: (unit, value text)}); the real file's kernel inserted at real_at."""
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL)
    w.writerow(HEAD)
    for i, (name, grid, m) in enumerate(kernels):
        w.writerows(_rows(i, name, grid, m))
    text = "==PROF== Connected to process 1\nprofiled 1 x\n" + buf.getvalue()
    if real is not None:
        lines = [ln for ln in real.read_text().splitlines() if ln.startswith('"0"')]
        text += "\n".join(f'"{real_at}"' + ln[3:] for ln in lines) + "\n"
    path.write_text(text)


def _k(us: float, unit: str = "us", **m) -> dict:
    out = {"Duration": (unit, f"{us * {'us': 1, 'ns': 1000, 'ms': 1e-3}[unit]:,}")}
    out.update({k: ("%", str(v)) for k, v in m.items()})
    return out


STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"


def test_kernels_go_to_the_case_of_the_marker_before_them(lim, tmp_path):
    cases = ["decode:b32:q4_0", "decode:b32:int2", "store:32k:kivi4"]
    _write(tmp_path / "n.csv", [
        (lim.MARKER, "(1, 1, 1)", _k(2)), ("_decode_mma_kernel", "(32, 8, 4)", _k(0.43, "ns")),
        ("merge_kernel", "(32, 32, 1)", _k(12)),
        # case 2 failed in the driver: no marker, nothing of it
        (lim.MARKER, "(3, 1, 1)", _k(2)), ("_store_kernel", "(512, 8, 1)", _k(64, "ms"))])
    got = lim.group(lim.read_kernels(tmp_path / "n.csv"), cases)
    assert list(got) == ["decode:b32:q4_0", "store:32k:kivi4"]
    assert [k["name"] for k in got["decode:b32:q4_0"]] == ["_decode_mma_kernel", "merge_kernel"]
    row = lim.summarize("decode:b32:q4_0", got["decode:b32:q4_0"])
    assert row["kernels"] == 2 and row["main_kernel"] == "merge_kernel"  # 12 us > 430 ns: units are read
    assert row["main_us"] == 12.0 and row["total_us"] == pytest.approx(12.4, abs=0.05)
    assert lim.summarize("store:32k:kivi4", got["store:32k:kivi4"])["main_us"] == 64.0


def test_the_summary_files(lim, tmp_path):
    """write_summary: the CSV (one row a case that has a marker) and its markdown table beside it."""
    _write(tmp_path / "n.csv", [(lim.MARKER, "(2, 1, 1)", _k(2)),
                                ("_store_kernel", "(512, 8, 1)", _k(64, **{"DRAM Throughput": 30.0}))])
    rows = lim.write_summary(str(tmp_path / "n.csv"), ["store:32k:q4_0", "store:32k:kivi4"], str(tmp_path / "s.csv"))
    assert [r["case"] for r in rows] == ["store:32k:kivi4"]
    assert next(csv.DictReader(open(tmp_path / "s.csv")))["main_us"] == "64.0"
    md = (tmp_path / "s.md").read_text().splitlines()
    assert md[0].startswith("| case | table | target |") and md[2].startswith("| store:32k:kivi4 |")


def test_a_marker_naming_no_case_is_an_error(lim, tmp_path):
    _write(tmp_path / "n.csv", [(lim.MARKER, "(5, 1, 1)", _k(2))])
    with pytest.raises(ValueError, match="names no case"):
        lim.group(lim.read_kernels(tmp_path / "n.csv"), ["decode:b32:q4_0"])


def test_the_limiter_rule(lim):
    def m(**kw):
        return {k: ("", v) for k, v in kw.items()}
    pipe = "sm__inst_executed_pipe_{}.avg.pct_of_peak_sustained_active"
    cyc = "sm__pipe_{}_cycles_active.avg.pct_of_peak_sustained_active"
    stalls = {STALL.format("long_scoreboard"): 0.5, STALL.format("wait"): 0.8, STALL.format("selected"): 1.0,
              STALL.format("not_selected"): 2.0}
    assert lim.limiter(m(**{"DRAM Throughput": 85.0, pipe.format("alu"): 90.0})) == "DRAM bandwidth"
    assert lim.limiter(m(**{"DRAM Throughput": 50.0, pipe.format("alu"): 60.0, cyc.format("alu"): 75.0,
                            pipe.format("fma"): 72.0})) == "alu pipe"
    assert lim.limiter(m(**{"DRAM Throughput": 50.0, pipe.format("alu"): 60.0,
                            "smsp__issue_active.avg.pct_of_peak_sustained_active": 71.0})) == "instruction issue"
    assert lim.limiter(m(**{"DRAM Throughput": 50.0, "Issued Warp Per Scheduler": 0.64, **stalls})) == \
        "latency (wait)"  # selected / not_selected are not waits
    assert lim.limiter({}) == "unknown (no stall counters)"


def test_the_real_ncu_file_reads_and_summarizes(lim, tmp_path):
    _write(tmp_path / "n.csv", [(lim.MARKER, "(1, 1, 1)", _k(2))], real=REAL, real_at=1)
    got = lim.group(lim.read_kernels(tmp_path / "n.csv"), ["decode:b32:q4_0"])
    row = lim.summarize("decode:b32:q4_0", got["decode:b32:q4_0"])
    assert row["main_kernel"] == "_decode_mma_kernel"
    assert row["main_us"] == pytest.approx(436.2, abs=0.1)  # 436,192 ns in the file
    assert row["regs"] == 168 and row["issue_pct"] == pytest.approx(64, abs=1)
    assert row["limiter"] == "latency (wait)" and row["top_stalls"].startswith("wait:0.82")


def test_misses_of_a_results_folder(lim, tmp_path):
    import run
    dec = [dict(scheme=s, dispatch=d, **{k: str(v) for k, v in run.SHAPES[sh].items()}, roofline_frac_graph=str(f))
           for s, d, sh, f in [("q4_0", "default", "b32", 0.66), ("fp8_e4m3", "default", "b32", 0.99),
                               ("q4_0", "heuristic", "b32", 0.5), ("q4_0", "default", "b1", 0.55),
                               ("q4_0", "default", "b8", 0.1), ("lm2", "default", "b32", 0.3),
                               ("q8_0", "default", "smollm2", 0.69)]]
    sto = [dict(scheme="kivi4", backend="triton", fraction_of_copy="0.32"),
           dict(scheme="q4_0", backend="triton", fraction_of_copy="0.71"),
           dict(scheme="lm2", backend="triton_prerotated", fraction_of_copy="0.02")]
    ext = [dict(scheme="q4_0", backend=b, **{k: str(v) for k, v in run.EXTEND_SHAPES[sh].items()}, ratio_vs_cudnn=r)
           for b, sh, r in [("auto_host", "p8k_b1", "1.28"), ("auto", "p8k_b1", "3.6"), ("auto_host", "p8k_b8", "1.1")]]
    for name, rows in (("decode.csv", dec), ("store.csv", sto), ("extend.csv", ext)):
        with open(tmp_path / name, "w", newline="") as f:
            w = csv.DictWriter(f, sorted({k for r in rows for k in r}))
            w.writeheader()
            w.writerows(rows)
    assert lim.misses(["decode", "store", "extend"], tmp_path) == [
        "decode:b32:q4_0", "decode:b1:q4_0", "decode:smollm2:q8_0", "store:32k:kivi4", "extend:p8k_b1:q4_0"]
    assert lim.misses(["decode:b1"], tmp_path) == ["decode:b1:q4_0"]
    assert lim.table_value("decode:b32:q4_0", tmp_path) == (0.66, 0.85)  # the default-dispatch row, not heuristic's
    assert lim.table_value("store:32k:kivi4", tmp_path) == (0.32, 0.6)
    assert lim.table_value("extend:p8k_b1:q4_0", tmp_path) == (1.28, 1.2)  # auto_host, not auto
    assert lim.table_value("decode:d256:q4_0", tmp_path)[0] is None
    with pytest.raises(ValueError, match="allowed: decode, store, extend"):
        lim.misses(["prefill"], tmp_path)


@pytest.mark.parametrize("case, what", [("decode:b32", "expected OP:SHAPE:SCHEME"), ("decode:b99:q4_0", "shape 'b99'"),
                                        ("store:32k:q5", "scheme 'q5'"), ("gen:b32:q4_0", "op 'gen'")])
def test_bad_cases_are_refused_with_what_is_allowed(lim, case, what):
    with pytest.raises(ValueError, match=what):
        lim.parse_case(case)


def test_the_driver_runs_every_kind_of_case_on_the_cpu(lim, capsys):
    """--smoke: the driver's builders on tiny shapes under the interpreter, so a device call does not fail on them."""
    cases = ["decode:b32:q4_0", "decode:smollm2:kivi4", "store:32k:kivi2", "store:32k:lm3", "extend:p8k_b1:q4_0"]
    assert lim.drive(cases, "cpu", smoke=True, warm=1) == cases
    assert "failed" not in capsys.readouterr().err
