"""The benchmark runner's store gate (`benchmarks/run.py` `store_gate`): 0 differing bytes for the kernel as it is
(the Triton store, under the interpreter here), and a corrupted byte caught, before any store is timed."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

import kvlab

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (the interpreter evaluates both sides of a where)
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def run_mod():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import run
    return run


@pytest.mark.parametrize("name", ["nf4", "kivi2"])
def test_store_gate_passes_the_kernel(run_mod, name):
    assert run_mod.store_gate(kvlab.scheme(name), D=64, Hk=2, T=70, backend="triton") == 0


def test_store_gate_catches_a_wrong_byte(run_mod, monkeypatch):
    import store_cases
    real = store_cases.store

    def broken(x, pages, slots, spec, backend="auto", **kw):
        used = real(x, pages, slots, spec, backend=backend, **kw)
        if backend != "reference":
            pages["codes"].view(-1)[int(slots[3]) * 4] ^= 1  # one code byte of one stored token
        return used

    monkeypatch.setattr(store_cases, "store", broken)
    assert run_mod.store_gate(kvlab.scheme("q4_0"), D=64, Hk=2, T=70, backend="triton") == 1
