"""Scheme search under a bit budget (kvlab.eval.search): the allocation is the exact optimum of the knapsack
(checked against brute force), respects the budget, prefers bits where layers are sensitive; sensitivities are
measured KL (zero for a float candidate); the chosen scheme is one DSL line that round-trips."""
from __future__ import annotations

import itertools
import random

import pytest
import torch

import kvlab
from kvlab.eval.search import allocate, layer_sensitivity, scheme_of, search


def _brute(sens, bits, budget):
    n = len(sens)
    best = None
    for ch in itertools.product(range(len(bits)), repeat=n):
        if sum(bits[c] for c in ch) / n <= budget + 1e-12:
            cost = sum(sens[layer][c] for layer, c in enumerate(ch))
            if best is None or cost < best[0] - 1e-15:
                best = (cost, list(ch))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_allocation_is_the_exact_optimum(seed):
    rng = random.Random(seed)
    n, bits = 5, [2.25, 3.25, 4.25]
    sens = [sorted((rng.random() ** 3 for _ in bits), reverse=True) for _ in range(n)]
    budget = rng.choice([2.5, 3.0, 3.25, 3.5, 4.0])
    ch = allocate(sens, bits, budget)
    cost = sum(sens[layer][c] for layer, c in enumerate(ch))
    want = _brute(sens, bits, budget)
    assert sum(bits[c] for c in ch) / n <= budget + 1e-12
    assert cost == pytest.approx(want[0], rel=1e-12, abs=1e-15)


def test_allocation_spends_bits_where_layers_are_sensitive():
    sens = [[1.0, 0.1], [0.01, 0.001], [0.02, 0.002]]  # layer 0 loses most at the low candidate
    assert allocate(sens, [2.0, 4.0], budget=2.7) == [1, 0, 0]
    with pytest.raises(ValueError, match="below the cheapest candidate"):
        allocate(sens, [2.0, 4.0], budget=1.9)


def test_scheme_of_is_one_line_that_round_trips():
    cands = ["lm2:rot=had", "lm4:rot=had"]
    sch = scheme_of([0, 1, 0, 0], cands)
    text = str(sch)
    assert kvlab.scheme(text) == sch
    assert sch.for_layer(1, 4)[0] == kvlab.scheme("lm4:rot=had").k and sch.for_layer(2, 4)[1] == sch.k
    assert "L1=" in text and text.count("L") == 1
    pairs = scheme_of([1, 0, 1], ["lm3:rot=had", "int3:g32:chan:asym|int3:g32:asym"])
    assert pairs.k.axis == "chan" and pairs.v.axis == "tok" and pairs.for_layer(1, 3)[0].fmt == "lm3"
    assert kvlab.scheme(str(pairs)) == pairs and "|" not in str(pairs)
    mixed = scheme_of([0, 1, 0], ["lm3:rot=had", "int3:g32:chan:asym|int3:g32:asym"])
    assert "L1=int3:g32:chan:asym|int3:g32:asym" in str(mixed) and kvlab.scheme(str(mixed)) == mixed
    with_sink = scheme_of([0, 1, 0, 0], cands, sink=4)
    assert with_sink.sink == 4 and kvlab.scheme(str(with_sink)) == with_sink


@torch.no_grad()
def test_sensitivities_are_measured_kl(tiny_llama):
    model = tiny_llama()
    segs = [torch.randint(0, 64, (48,), generator=torch.Generator().manual_seed(1))]
    sens = layer_sensitivity(model, segs, ["bf16", "lm2:rot=had", "lm4:rot=had"])
    assert len(sens) == 2 and all(len(r) == 3 for r in sens)
    for row in sens:
        assert row[0] < 1e-6  # a float cache changes nothing
        assert row[1] > row[2] > 0  # 2 bits cost more than 4


def test_search_on_smollm2_respects_the_budget(smollm2):
    model, tok = smollm2
    small = ["lm2:rot=had", "lm4:rot=had"]
    res = search(model, tok, small, budget=3.0, calib_tokens=32)
    assert res["bits_per_element"] <= 3.0 + 1e-9 and len(res["choice"]) == model.config.n_layers
    assert {c for c in res["choice"]} <= set(small) and res["calib_text"] == "license"
    assert kvlab.scheme(res["scheme"]).for_layer(0, model.config.n_layers)[0].fmt in ("lm2", "lm4")


def test_search_command_refuses_evaluating_on_its_calibration_text(capsys):
    from kvlab.sweep.__main__ import main
    assert main(["search", "--budget", "3", "--text", "license", "--calib-text", "license"]) == 2
    assert "evaluate on text the search did not see" in capsys.readouterr().err
