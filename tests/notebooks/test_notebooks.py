"""The notebooks: each runs top to bottom on the CPU with small parameters (papermill: it injects values
into the cell tagged `parameters`, as a user would with `papermill -p`), its committed .ipynb is the
executed twin of its jupytext .py (same code, outputs present, no errors), and no cell names a path that
exists on one machine only."""
from __future__ import annotations

import pathlib
import re

import pytest

nbformat = pytest.importorskip("nbformat")
jupytext = pytest.importorskip("jupytext")
papermill = pytest.importorskip("papermill")

DIR = pathlib.Path(__file__).resolve().parents[2] / "notebooks"
NAMES = sorted(p.stem for p in DIR.glob("[0-9][0-9]_*.py"))
SMALL = {  # CI parameters: a few minutes in all on 2 CPU cores
    "01_tour": {"N_TOKENS": 512},
    "02_distributions": {"N_TOKENS": 256, "LAYERS": [0, 29], "SCHEMES": ["q4_0", "int4:g32:chan:asym"]},
    "03_attention_and_perplexity": {"N_TOKENS": 128, "SCHEMES": ["q4_0", "kivi4"], "SCAN_LAYERS": [0, 10, 29]},
    "04_kernels": {},
    "05_pareto_and_export": {},
}


def test_every_notebook_has_parameters():
    assert NAMES == sorted(SMALL), "add the new notebook's CI parameters to SMALL"


@pytest.mark.parametrize("name", NAMES)
def test_committed_notebook_is_the_executed_twin(name):
    py = jupytext.read(DIR / f"{name}.py")
    nb = nbformat.read(DIR / f"{name}.ipynb", as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code" and "injected-parameters" not in c.metadata.get("tags", [])]
    assert code == [c.source for c in py.cells if c.cell_type == "code"], f"run: jupytext --sync notebooks/{name}.py"
    ran = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in ran), "commit the notebook executed (papermill NAME.ipynb NAME.ipynb)"
    assert not [o for c in ran for o in c.outputs if o.output_type == "error"]
    assert any(c.metadata.get("tags") == ["parameters"] for c in nb.cells), "a cell tagged `parameters`"


@pytest.mark.parametrize("name", NAMES)
def test_no_machine_paths(name):
    src = (DIR / f"{name}.py").read_text()
    assert not re.search(r"(/work/|/home/|/root/|/tmp/|[A-Z]:\\\\)", src), "paths relative to notebooks/ only"


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_small_on_cpu(name, tmp_path):
    params = dict(SMALL[name])
    if name == "05_pareto_and_export":
        params["OUT"] = str(tmp_path / "export")
    out = tmp_path / f"{name}.ipynb"
    papermill.execute_notebook(str(DIR / f"{name}.ipynb"), str(out), parameters=params, cwd=str(DIR),
                               kernel_name="python3", progress_bar=False)
    nb = nbformat.read(out, as_version=4)
    assert any(o.get("data", {}).get("image/png") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
