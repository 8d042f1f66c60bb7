"""The paper: rebuilt from the committed results it equals the committed text, every number in it has a
source, and a number without one fails the build."""
from __future__ import annotations

import pathlib

import pytest

from kvlab.paper import Numbers, Paper
from kvlab.paper.__main__ import main

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("paper")
    return Paper(ROOT, out).build()


def test_committed_paper_is_the_build(built):
    assert (ROOT / "paper" / "kvlab.md").read_text() == built.read_text(), "run: python -m kvlab.paper"
    for fig in ("pareto.png", "decode_speedup.png", "engine_options.png"):
        assert (built.parent / "figures" / fig).stat().st_size > 10_000
        assert (ROOT / "paper" / "figures" / fig).is_file()
        assert f"figures/{fig}" in built.read_text()


def test_every_number_has_a_source(built):
    text = built.read_text()
    n = Numbers()
    assert n.unsourced("KL 0.0312 at 4.50 bits") == ["'0.0312' in: KL 0.0312 at 4.50 bits",
                                                     "'4.50' in: KL 0.0312 at 4.50 bits"]
    assert n.unsourced("`q4_0` on SmolLM2-135M, int4:g32, an H200 (2026)") == []  # names and years
    n.cite(0.0312, ".4f", "x.csv: row / kl")
    assert n.unsourced("KL 0.0312") == []
    assert "## Appendix: provenance" in text and "sweeps/results/engines/options.csv" in text


def test_a_number_without_a_source_fails_the_build(tmp_path, monkeypatch):
    orig = Paper.limitations
    monkeypatch.setattr(Paper, "limitations", lambda self: orig(self) + ["It is 42% better."])
    assert main(["--root", str(ROOT), "--out", str(tmp_path / "p")]) == 2


def test_missing_result_file_names_the_command(tmp_path, capsys):
    assert main(["--root", str(tmp_path), "--out", str(tmp_path / "p")]) == 2
    assert "it comes from: python -m kvlab.sweep" in capsys.readouterr().err
