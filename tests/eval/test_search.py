"""Scheme search under a bit budget (kvlab.eval.search): the allocation is the exact optimum of the knapsack
(checked against brute force), respects the budget, prefers bits where layers are sensitive; sensitivities are
measured KL (zero for a float candidate); the chosen scheme is one DSL line that round-trips."""
from __future__ import annotations

import itertools
import random

import pytest
import torch

import kvlab
from kvlab.spec import as_spec
from kvlab.eval.search import allocate, choose, head_sensitivity, layer_sensitivity, scheme_of, scheme_of_heads, search


def _brute(sens, bits, budget, ms=None, ms_budget=None):
    n = len(sens)
    best = None
    for ch in itertools.product(range(len(bits)), repeat=n):
        fast = ms is None or sum(ms[i][c] for i, c in enumerate(ch)) <= ms_budget + 1e-12
        if sum(bits[c] for c in ch) / n <= budget + 1e-12 and fast:
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


def test_mixed_scheme_pays_the_channel_groups_fp_tokens_in_every_layer():
    """The pool keeps the last up-to Gc - 1 tokens of every layer in bf16 once any layer has a channel-axis spec
    (one policy, one block table), so the effective bits of a mixed scheme count them in its token-axis layers too;
    the worst case includes the window (window + Gc - 1 tokens)."""
    mixed = kvlab.scheme("lm2:g64:rot=had,L1=int2:g32:chan:asym|lm2:g64:rot=had")
    q = kvlab.scheme("lm2:g64:rot=had").bits_per_element(64)
    assert mixed.chan_group(4) == 32 and kvlab.scheme("lm2:g64:rot=had").chan_group(4) == 1
    q1 = kvlab.scheme("k=int2:g32:chan:asym,v=lm2:g64:rot=had").bits_per_element(64)
    assert (q, q1) == (2.25, (3 + 2.25) / 2)
    assert mixed.bits_per_element(64, context=2048, n_layers=4) == pytest.approx(
        (31 * 16 + 2017 * (3 * q + q1) / 4) / 2048)
    kivi = kvlab.scheme("kivi4")  # window 128 + an unfinished group of up to 31 tokens
    qk = kivi.bits_per_element(128)
    assert kivi.bits_per_element(128, context=2048) == pytest.approx((159 * 16 + 1889 * qk) / 2048)


def test_search_prices_token_axis_candidates_with_the_schemes_fp_tail():
    """choose() keeps the better of an all-token-axis allocation (no fp tail) and one over every candidate with the
    channel group's tail charged to every layer; its reported bits are what the evaluated scheme counts."""
    from kvlab.eval.search import choose, regimes
    cands = ["lm2:g64:rot=had", "lm3:g64:rot=had", "int2:g32:chan:asym|lm2:g64:rot=had"]
    assert regimes(cands, 2048) == [(1, [0, 1]), (32, [0, 1, 2])]
    assert regimes(cands, None) == [(32, [0, 1, 2])]
    n, ctx = 4, 2048
    for sens, want_g in (([[1.0, 0.5, 0.9]] * n, 1),      # the chan candidate barely helps: no tail
                         ([[1.0, 0.95, 0.01]] * n, 32)):  # it is much better: pay the tail everywhere
        res = choose({"sens": sens, "candidates": cands, "context": ctx, "sink": 0}, 2.7, 64)
        assert res["chan_group"] == want_g
        sch = kvlab.scheme(res["scheme"])
        assert sch.chan_group(n) == want_g
        assert res["bits_per_element"] == pytest.approx(sch.bits_per_element(64, context=ctx, n_layers=n))
        assert sch.bits_per_element(64, context=ctx, n_layers=n) <= 2.7 + 1e-9


def test_regimes_cover_every_channel_group_lcm():
    """Candidates with channel groups 32 and 128: a scheme of g32 layers only pays 31 bf16 tokens, not 127; the
    search prices each reachable lcm with the candidates that fit it and reports the chosen scheme's own bits."""
    from kvlab.eval.search import choose, regimes
    cands = ["lm2:g64:rot=had", "int2:g32:chan:asym|lm2:g64:rot=had", "int2:g128:chan:asym|lm2:g64:rot=had"]
    assert regimes(cands, 2048) == [(1, [0]), (32, [0, 1]), (128, [0, 1, 2])]
    res = choose({"sens": [[1.0, 0.01, 0.02]] * 4, "candidates": cands, "context": 2048, "sink": 0}, 3.0, 64)
    sch = kvlab.scheme(res["scheme"])
    assert res["choice"] == [cands[1]] * 4 and res["chan_group"] == 32 == sch.chan_group(4)
    assert res["bits_per_element"] == pytest.approx(sch.bits_per_element(64, context=2048, n_layers=4))
    assert res["bits_per_element"] < 3.0


def test_search_with_a_window_prices_it_and_keeps_it_in_the_scheme():
    """A full-precision window is part of every candidate's price (window + Gc - 1 tokens at worst) and of the chosen
    scheme's text; the evaluated scheme counts the same bits."""
    from kvlab.eval.search import choose
    cands = ["lm2:g64:rot=had", "lm3:g64:rot=had", "int2:g32:chan:asym|lm2:g64:rot=had"]
    n, ctx = 4, 2048
    for sens in ([[1.0, 0.5, 0.9]] * n, [[1.0, 0.95, 0.01]] * n):
        res = choose({"sens": sens, "candidates": cands, "context": ctx, "sink": 0, "window": 16}, 2.8, 64)
        sch = kvlab.scheme(res["scheme"])
        assert sch.window == 16 and "window=16" in res["scheme"]
        assert res["bits_per_element"] == pytest.approx(sch.bits_per_element(64, context=ctx, n_layers=n))
        assert res["bits_per_element"] <= 2.8 + 1e-9
    with pytest.raises(ValueError, match="below the cheapest"):  # 16 + 31 bf16 tokens leave no room at 2.4 bits
        choose({"sens": [[1.0, 0.5, 0.9]] * n, "candidates": cands, "context": ctx, "sink": 0, "window": 32}, 2.4, 64)


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


@pytest.mark.parametrize("seed", range(6))
def test_allocation_under_a_decode_time_budget_is_the_exact_optimum(seed):
    """Times on the DP's time grid (multiples of ms_budget / TIME_UNITS): the choice is the brute-force optimum
    under both budgets, and meets both."""
    from kvlab.eval.search import TIME_UNITS
    rng = random.Random(seed)
    n, bits = 5, [2.25, 3.25, 4.25, 8.5]
    ms_budget = 1.0
    unit = ms_budget / TIME_UNITS
    ms = [[unit * rng.choice([40, 60, 80, 120]) for _ in bits] for _ in range(n)]
    sens = [sorted((rng.random() ** 3 for _ in bits), reverse=True) for _ in range(n)]
    budget = rng.choice([3.0, 3.5, 4.5, 6.0])
    want = _brute(sens, bits, budget, ms, ms_budget)
    ch = allocate(sens, bits, budget, ms, ms_budget)
    assert sum(bits[c] for c in ch) / n <= budget + 1e-12 and sum(ms[i][c] for i, c in enumerate(ch)) <= ms_budget + 1e-9
    assert sum(sens[i][c] for i, c in enumerate(ch)) == pytest.approx(want[0], rel=1e-12, abs=1e-15)


def test_decode_time_budget_trades_accuracy_for_speed():
    sens = [[1.0, 0.1, 0.0], [1.0, 0.1, 0.0]]  # candidate 2 is exact but slow, 1 close and fast
    bits, ms = [2.0, 4.0, 4.0], [[0.1, 0.1, 0.5], [0.1, 0.1, 0.5]]
    assert allocate(sens, bits, 4.0) in ([2, 2],)
    assert sorted(allocate(sens, bits, 4.0, ms, 0.61)) == [1, 2]
    assert allocate(sens, bits, 4.0, ms, 0.25) == [1, 1]
    with pytest.raises(ValueError, match="below the fastest"):
        allocate(sens, bits, 4.0, ms, 0.1)
    with pytest.raises(ValueError, match="untimed"):
        allocate(sens, bits, 4.0, [[0.1, None, 0.5], [0.1, 0.1, 0.5]], 1.0)


def test_decode_ms_table_reads_pairs_per_layer_context(tmp_path):
    """Gemma-like sliding layers look up their window's row; a missing row is None."""
    from types import SimpleNamespace

    from kvlab.eval.search import decode_ms_table
    cfg = SimpleNamespace(n_layers=3, n_heads=4, n_kv_heads=1, head_dim=256,
                          layer_window=lambda i: None if i == 2 else 512)
    f = tmp_path / "pairs.csv"
    f.write_text("k_spec,v_spec,window,sink,context,heads_q,heads_kv,head_dim,graph_ms\n"
                 "bf16,bf16,0,0,512,4,1,256,0.01\nbf16,bf16,0,0,8192,4,1,256,0.08\n"
                 "int2:g32:chan:asym,int2:g32:asym,0,0,512,4,1,256,0.05\n")
    t = decode_ms_table(f, cfg, ["bf16", "int2:g32:chan:asym|int2:g32:asym"], 8192)
    assert t == [[0.01, 0.05], [0.01, 0.05], [0.08, None]]


def test_decode_budget_option(tmp_path, capsys):
    """--decode-budget in ms or as a multiple of bf16 from the table; a candidate the table lacks, a bad budget and
    a budget without its table are clear errors (before any model work)."""
    from types import SimpleNamespace

    from kvlab.sweep.__main__ import main
    from kvlab.sweep.search_cli import decode_budget
    cfg = SimpleNamespace(n_layers=2, n_heads=9, n_kv_heads=3, head_dim=64)
    f = tmp_path / "pairs.csv"
    f.write_text("k_spec,v_spec,window,sink,context,heads_q,heads_kv,head_dim,graph_ms\n"
                 "bf16,bf16,0,0,8192,9,3,64,0.06\nlm3:g64:rot=had,lm3:g64:rot=had,0,0,8192,9,3,64,0.25\n")
    ms, b = decode_budget(str(f), cfg, ["lm3:rot=had"], 8192, 0, "1.5x")
    assert ms == [[0.25], [0.25]] and b == pytest.approx(0.18)
    assert decode_budget(str(f), cfg, ["lm3:rot=had"], 8192, 0, "0.4")[1] == 0.4
    with pytest.raises(ValueError, match="no timed row .* lm2:rot=had"):
        decode_budget(str(f), cfg, ["lm3:rot=had", "lm2:rot=had"], 8192, 0, "1x")
    with pytest.raises(ValueError, match="must be a number of ms or NUMx"):
        decode_budget(str(f), cfg, ["lm3:rot=had"], 8192, 0, "fast")
    assert main(["search", "--budget", "3", "--speed-table", str(f)]) == 2
    assert "--speed-table and --decode-budget go together" in capsys.readouterr().err


def test_sensitivity_table_reused_and_extended(smollm2, tmp_path, monkeypatch):
    """--sensitivity with a table that lacks some candidates: its columns are reused as they are, only the missing
    candidates are measured, and the result follows the requested candidate order."""
    import kvlab.eval.search as es
    from kvlab.sweep.search_cli import reuse_sensitivity
    model, tok = smollm2
    n = model.config.n_layers
    f = tmp_path / "sensitivity.csv"
    f.write_text("layer,a,b\n" + "".join(f"{i},{i * 0.1:.6g},{i * 0.2:.6g}\n" for i in range(n)))
    asked = []

    def fake(model_, segs, cands, progress=None, sink=0, window=0):
        asked.append(list(cands))
        return [[1000.0 + i + j for j in range(len(cands))] for i in range(n)]
    monkeypatch.setattr(es, "layer_sensitivity", fake)
    bar = type("Bar", (), {"total": 0, "refresh": lambda self: None, "update": lambda self, k=1: None})()
    t = reuse_sensitivity(str(f), ["c", "b", "a"], model, tok, "license", 64, 0, 0, bar)
    assert asked == [["c"]] and bar.total == n
    assert t[3] == [1003.0, pytest.approx(0.6), pytest.approx(0.3)]
    assert reuse_sensitivity(str(f), ["a"], model, tok, "license", 64, 0, 0, bar)[2] == [pytest.approx(0.2)]
    assert asked == [["c"]]  # nothing measured when the table has every candidate
    f.write_text("layer,a\n0,1\n")
    with pytest.raises(ValueError, match="has 1 rows"):
        reuse_sensitivity(str(f), ["a"], model, tok, "license", 64, 0, 0, bar)


def test_large_reference_logits_are_computed_once(tiny_llama, monkeypatch):
    """Segments whose logits exceed LOGITS_BUDGET / 4 are cached one at a time: scoring the same segment again (the
    search's layer x candidate loop) runs the full-precision forward once; another large segment replaces it."""
    import kvlab.eval.perplexity as pp
    model = tiny_llama()
    monkeypatch.setattr(pp, "LOGITS_BUDGET", 64)
    monkeypatch.setattr(pp, "_REF_CACHE", {})
    calls = []
    fwd = model.forward
    monkeypatch.setattr(model, "forward", lambda *a, **k: (calls.append(1), fwd(*a, **k))[1])
    a, b = torch.arange(40) % 64, (torch.arange(40) * 7) % 64
    r1 = pp.reference_logits(model, a)
    assert pp.reference_logits(model, a) is r1 and len(calls) == 1
    pp.reference_logits(model, b)
    assert len(calls) == 2 and len(pp._REF_CACHE) == 1
    assert torch.equal(pp.reference_logits(model, a).logprobs, r1.logprobs) and len(calls) == 3


@torch.no_grad()
def test_head_sensitivities_are_measured_one_head_at_a_time(tiny_llama):
    model = tiny_llama(heads=4, kv_heads=2)
    segs = [torch.randint(0, 64, (48,), generator=torch.Generator().manual_seed(1))]
    sens = head_sensitivity(model, segs, ["bf16", "lm2:rot=had", "lm4:rot=had"])
    assert len(sens) == 2 * 2 and all(len(r) == 3 for r in sens)  # (layer, head) rows
    for row in sens:
        assert row[0] < 1e-5  # a float head changes nothing (its pages hold bf16 values)
        assert row[1] > row[2] > 0
    layer = layer_sensitivity(model, segs, ["lm2:rot=had"])
    for i in range(2):  # one head of a layer costs less than the whole layer
        assert max(sens[2 * i][1], sens[2 * i + 1][1]) < layer[i][0]
    with pytest.raises(ValueError, match="per-head candidates.*calibrated state"):
        head_sensitivity(model, segs, ["nvfp4"])


def test_scheme_of_heads_is_one_line_with_head_overrides_that_round_trips():
    cands = ["lm2:rot=had", "lm4:rot=had", "int3:g32:chan:asym|int3:g32:asym"]
    choice = [0, 0, 0,  1, 1, 0,  0, 2, 0,  0, 0, 0]  # 4 layers x 3 KV heads
    sch = scheme_of_heads(choice, cands, 3)
    text = str(sch)
    assert kvlab.scheme(text) == sch
    assert "L1=lm4" in text and "L1.h2=lm2:g64:rot=had" in text and "L2.h1=int3:g32:chan:asym|int3:g32:asym" in text
    for u, c in enumerate(choice):
        ks, _, vs = cands[c].partition("|")
        assert sch.head_specs(u // 3, 4, 3)[u % 3] == (as_spec(ks), as_spec(vs or ks))
    with pytest.raises(ValueError, match="pass n_kv_heads"):
        sch.bits_per_element(64, context=2048, n_layers=4)
    per_head = sch.bits_per_element(64, n_layers=4, n_kv_heads=3)
    want = sum((as_spec(cands[c].split("|")[0]).bits_per_element_at(64)
                + as_spec(cands[c].split("|")[-1]).bits_per_element_at(64)) / 2 for c in choice) / len(choice)
    assert per_head == pytest.approx(want)


def test_per_head_allocation_under_a_budget(monkeypatch):
    """choose() on a per-head table: one unit per (layer, head), bits within the budget, sensitive heads get bits."""
    cands = ["lm2:rot=had", "lm4:rot=had"]
    sens = [[1.0, 0.0] if u in (1, 4) else [0.01, 0.0] for u in range(6)]  # 2 layers x 3 heads
    res = {"sens": sens, "candidates": cands, "sink": 0, "window": 0, "context": None, "per_head": 3}
    out = choose(res, budget=3.0, head_dim=64)  # lm2 2.25 and lm4 4.25 bits at D 64: room for two lm4 heads
    sch = kvlab.scheme(out["scheme"])
    assert out["bits_per_element"] <= 3.0 + 1e-9
    assert [sch.head_specs(u // 3, 2, 3)[u % 3][0].fmt for u in range(6)] == ["lm2", "lm4", "lm2", "lm2", "lm4", "lm2"]
    assert out["predicted_kl"] == pytest.approx(0.04)


@pytest.mark.parametrize("seed", range(3))
def test_head_allocation_with_few_groups_is_the_exact_optimum(seed):
    """allocate_heads against brute force over every per-head choice with <= max_groups distinct pairs a layer."""
    from kvlab.eval.search import allocate_heads
    rng = random.Random(seed)
    hk, n, bits = 3, 2, [2.25, 3.25, 4.25]
    sens = [[rng.random() * 2 ** -c for c in range(3)] for _ in range(n * hk)]
    for groups in (1, 2, 3):
        got = allocate_heads(sens, bits, 3.0, hk, groups)
        best = None
        for ch in itertools.product(range(3), repeat=n * hk):
            if any(len(set(ch[i * hk:(i + 1) * hk])) > groups for i in range(n)):
                continue
            if sum(bits[c] for c in ch) / len(ch) <= 3.0 + 1e-12:
                cost = sum(sens[u][c] for u, c in enumerate(ch))
                best = cost if best is None or cost < best else best
        assert all(len(set(got[i * hk:(i + 1) * hk])) <= groups for i in range(n))
        assert sum(bits[c] for c in got) / len(got) <= 3.0 + 1e-9
        assert sum(sens[u][c] for u, c in enumerate(got)) == pytest.approx(best)
    with pytest.raises(ValueError, match="max_groups"):
        allocate_heads(sens, bits, 3.0, hk, 0)
