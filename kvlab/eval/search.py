"""Scheme search under a bit budget: measured per-layer sensitivities, then the cheapest allocation.

    res = search(model, tokenizer, ["lm2:rot=had", "lm3:rot=had", "lm4:rot=had"], budget=3.5)
    res["scheme"]        # one DSL line: the most used candidate as base, the other layers as L<i>= overrides

1. Sensitivity (on calibration text): for every layer l and candidate c, KL(full || model with layer l's cache
   in c and every other layer in full precision), through the decode-faithful backend (`score_segments`).
2. Allocation: one candidate per layer minimising the summed sensitivities (KL adds up across layers to first
   order) subject to the mean effective bits per element over layers <= budget: an exact multiple-choice
   knapsack by dynamic programming over bit units of 1/64 bit.
3. Optionally a decode-time budget: with a table of measured decode times per layer and candidate (from the GPU,
   `decode_ms_table` reads benchmarks/winners_decode.py's pairs.csv), the allocation also keeps the layers' summed
   decode time within it (a second dimension of the same dynamic program).
4. The chosen scheme is then evaluated like any other (`evaluate_scheme`), on held-out text.
5. Per head (`per_head=True`): the same, one unit per (layer, KV head) instead of per layer (`head_sensitivity`); the
   scheme gets `L<i>.h<j>=` overrides where a head's choice differs from its layer's most used one.

A candidate is one spec for a layer's K and V, or a pair `KSPEC|VSPEC` (the scheme DSL's `L<i>=KSPEC|VSPEC`):
channel-axis keys with token-axis values, more bits for keys than values, and so on.
"""
from __future__ import annotations

import math

import torch

from ..spec import KVScheme, as_scheme, as_spec
from .perplexity import bos_prefix, score_segments, segments, text_tokens

UNIT = 64  # bit units per bit in the allocation
TIME_UNITS = 400  # time units a decode-time budget is split into


def pair(candidate: str) -> tuple:
    """(K spec, V spec) of a candidate: `SPEC` (both) or `KSPEC|VSPEC`."""
    ks, bar, vs = candidate.partition("|")
    return as_spec(ks), as_spec(vs if bar else ks)


def _spec_bits(candidate: str, head_dim: int, context: int | None = None, sink: int = 0,
               chan_group: int | None = None, window: int = 0) -> float:
    """A layer's bits per element in `candidate`: nominal, or with `context` effective (sinks and the unfinished
    channel group of Gc - 1 tokens kept full precision, amortized over `context` tokens, as `evaluate_scheme`
    counts; Gc: `chan_group`, the lcm of the whole scheme's channel groups, which every layer pays; `window` recent
    tokens full precision too)."""
    ks, vs = pair(candidate)
    return KVScheme(k=ks, v=vs, sink=sink, window=window).bits_per_element(head_dim, context=context,
                                                                          chan_group=chan_group)


def regimes(candidates: list[str], context: int | None) -> list[tuple[int, list[int]]]:
    """[(Gc, candidate indices)]: the pool keeps one full-precision policy for all layers, so a scheme whose
    channel-axis groups have lcm Gc holds the last up-to Gc - 1 tokens of every layer in bf16. The search therefore
    prices the candidates once per reachable Gc (the lcm of each subset of the candidates' channel groups, 1 for
    none), each time with the candidates whose groups divide it, and keeps the best allocation. Nominal bits (no
    `context`) need no split."""
    groups = [KVScheme(*pair(c)).chan_group() for c in candidates]
    if context is None or max(groups) == 1:
        return [(math.lcm(*groups), list(range(len(candidates))))]
    reach = {1}
    for g in sorted(set(groups) - {1}):
        reach |= {math.lcm(r, g) for r in reach}
    return [(gc, [i for i, g in enumerate(groups) if gc % g == 0]) for gc in sorted(reach)
            if any(gc % g == 0 for g in groups)]


@torch.no_grad()
def layer_sensitivity(model, segs: list[torch.Tensor], candidates: list[str], progress=None,
                      sink: int = 0, window: int = 0) -> list[list[float]]:
    """sens[l][c]: mean KL over `segs` with layer l's K and V in candidate c, every other layer bf16 (the first
    `sink` tokens and the `window` most recent ones of every layer full precision, as the searched scheme will keep
    them). Candidates that need calibration (static scales, calibrated codebooks, key smoothing) are calibrated once
    on the first segment (the calibration text the sensitivities are measured on; `kvlab.eval.faithful.calibrate`,
    which reads the unquantized model, so one pass serves every layer)."""
    from .faithful import calibrate, needs_calibration
    n = model.config.n_layers
    specs = [pair(c) for c in candidates]
    fp = as_scheme("bf16")
    cals = [calibrate(model, segs[0][None], KVScheme(k=ks, v=vs, sink=sink, window=window))
            if needs_calibration(ks) or needs_calibration(vs) else {} for ks, vs in specs]
    return [[_mean_kl(model, segs, KVScheme(k=fp.k, v=fp.v, sink=sink, window=window, overrides=((layer, *spec),)),
                      {layer: cal[layer]} if layer in cal else None, progress)
             for spec, cal in zip(specs, cals)] for layer in range(n)]


def _mean_kl(model, segs, sch: KVScheme, calib, progress) -> float:
    """Mean KL of `sch` over `segs` (one sensitivity entry), then one tick of `progress`."""
    rows = score_segments(model, segs, sch, calib)
    if progress is not None:
        progress()
    return sum(r["kl"] for r in rows) / len(rows)


@torch.no_grad()
def head_sensitivity(model, segs: list[torch.Tensor], candidates: list[str], progress=None,
                     sink: int = 0, window: int = 0) -> list[list[float]]:
    """sens[l * Hk + h][c]: mean KL over `segs` with KV head h of layer l in candidate c (its K and V), every other
    head and layer bf16 (`layer_sensitivity` one head at a time: Hk times the forwards). Candidates must keep no
    calibrated state (`kvlab.spec.scheme.HEAD_STATE_RULE`): per-head specs cannot."""
    n, hk = model.config.n_layers, model.config.n_kv_heads
    specs = [pair(c) for c in candidates]
    fp = as_scheme("bf16")

    def one(layer, head, spec):
        return KVScheme(k=fp.k, v=fp.v, sink=sink, window=window, head_overrides=((layer, head, *spec),))
    for c, spec in zip(candidates, specs):  # the scheme's own check, before any forward
        try:
            one(0, 0, spec)
        except ValueError as e:
            raise ValueError(f"per-head candidates: {c} is refused ({e})") from None
    return [[_mean_kl(model, segs, one(layer, head, spec), None, progress) for spec in specs]
            for layer in range(n) for head in range(hk)]


def allocate(sens: list[list[float]], bits: list[float], budget: float, ms: list[list[float]] | None = None,
             ms_budget: float | None = None) -> list[int]:
    """Candidate index per layer minimising sum(sens[l][c_l]) with mean(bits[c_l]) <= budget, and with `ms`
    (ms[l][c]: measured decode time of candidate c at layer l) also sum(ms[l][c_l]) <= ms_budget.

    An exact dynamic program over bit units of 1/UNIT (and time units of ms_budget / TIME_UNITS, each layer's time
    rounded up, so a choice never exceeds the time budget; it may miss a choice within one unit per layer of
    it). ValueError when even the cheapest candidates exceed a budget."""
    import numpy as np
    n, units = len(sens), [math.ceil(b * UNIT - 1e-9) for b in bits]  # up: a choice never exceeds the budget
    cap = math.floor(budget * UNIT * n + 1e-9)
    if min(units) * n > cap:
        raise ValueError(f"budget {budget} bits/element is below the cheapest candidate ({min(bits):.3f})")
    timed = ms is not None and ms_budget is not None
    if timed:
        if len(ms) != n or any(len(r) != len(bits) for r in ms):
            raise ValueError(f"the decode-time table is not {n} layers x {len(bits)} candidates")
        if any(v is None or not math.isfinite(v) for r in ms for v in r):
            raise ValueError("the decode-time table has untimed entries; time every candidate or drop it")
        tunit = ms_budget / TIME_UNITS
        tu = [[math.ceil(v / tunit - 1e-9) for v in r] for r in ms]
        if sum(min(r) for r in tu) > TIME_UNITS:
            raise ValueError(f"decode budget {ms_budget:.4g} ms is below the fastest candidates' "
                             f"{sum(min(r) for r in ms):.4g} ms")
    T = TIME_UNITS + 1 if timed else 1
    cost = np.full((cap + 1, T), np.inf)
    cost[0, 0] = 0.0
    if len(bits) > 32767:
        raise ValueError(f"{len(bits)} candidates; at most 32767 are allowed")
    back = np.full((n, cap + 1, T), -1, dtype=np.int8 if len(bits) <= 127 else np.int16)
    for layer in range(n):
        nxt = np.full_like(cost, np.inf)
        for c, u in enumerate(units):
            t = tu[layer][c] if timed else 0
            if u > cap or t >= T:
                continue
            cand = cost[:cap + 1 - u, :T - t] + sens[layer][c]
            view = nxt[u:, t:]
            better = cand < view
            view[better] = cand[better]
            back[layer, u:, t:][better] = c
        cost = nxt
    if not np.isfinite(cost).any():
        raise ValueError("no choice meets both budgets")
    b, t = np.unravel_index(np.argmin(cost), cost.shape)
    choice = []
    for layer in range(n - 1, -1, -1):
        c = int(back[layer, b, t])
        choice.append(c)
        b, t = b - units[c], t - (tu[layer][c] if timed else 0)
    return choice[::-1]


def layer_contexts(config, context: int) -> list[int]:
    """Tokens each layer's cache holds at `context`: sliding-window layers (Gemma 3's local layers, Mistral) only
    their window."""
    out = []
    for i in range(config.n_layers):
        w = config.layer_window(i) if hasattr(config, "layer_window") else getattr(config, "sliding_window", None)
        out.append(context if w is None else min(context, w))
    return out


def read_speed_table(pairs_csv) -> dict:
    """A pairs.csv of benchmarks/winners_decode.py -> {(K spec text, V spec text, window, sink, context, Hq, Hk, D):
    graph-replay ms, or None where the pair was not timed}."""
    import csv
    with open(pairs_csv) as f:
        return {(r["k_spec"], r["v_spec"], int(r["window"]), int(r["sink"]), int(r["context"]), int(r["heads_q"]),
                 int(r["heads_kv"]), int(r["head_dim"])): float(r["graph_ms"]) if r["graph_ms"] else None
                for r in csv.DictReader(f)}


def decode_ms_table(pairs_csv, config, candidates: list[str], context: int, sink: int = 0,
                    window: int = 0) -> list[list[float | None]]:
    """ms[l][c]: measured decode time of candidate c's (K spec, V spec) at layer l of a model with `config`, at the
    layer's context (`layer_contexts`), from a pairs.csv of benchmarks/winners_decode.py (None where the table has
    no timed row for it). Candidate "bf16" gives the full-precision cache's times."""
    rows = read_speed_table(pairs_csv)
    shape = (config.n_heads, config.n_kv_heads, config.head_dim)
    ctx = layer_contexts(config, context)
    specs = [pair(c) for c in candidates]
    return [[rows.get((str(ks), str(vs), window, sink, ctx[layer], *shape)) for ks, vs in specs]
            for layer in range(config.n_layers)]


def scheme_of(choice: list[int], candidates: list[str], sink: int = 0, window: int = 0) -> KVScheme:
    """The DSL scheme of a per-layer choice: the most used candidate as base, the others as `L<i>=` overrides
    (and `sink` full-precision first tokens, `window` full-precision recent tokens)."""
    base = max(set(choice), key=lambda c: (choice.count(c), -c))
    ks, vs = pair(candidates[base])
    over = tuple((layer, *pair(candidates[c])) for layer, c in enumerate(choice) if c != base)
    return KVScheme(k=ks, v=vs, sink=sink, window=window, overrides=over)


MAX_OPTIONS = 20000  # per-layer head assignments `allocate_heads` enumerates at most


def allocate_heads(sens: list[list[float]], bits: list[float], budget: float, n_kv_heads: int,
                   max_groups: int) -> list[int]:
    """Candidate index per (layer, KV head) unit (rows l * Hk + h of `sens`) minimising the summed sensitivities with
    the mean bits <= budget and at most `max_groups` distinct candidates among each layer's heads (each distinct pair
    is one page set and one attention launch a step: fewer groups decode faster). Every assignment of candidates to a
    layer's heads with at most `max_groups` distinct ones is one option of the exact knapsack over layers
    (`allocate`); ValueError when the candidates over the heads give more than MAX_OPTIONS assignments."""
    import itertools
    if not isinstance(max_groups, int) or max_groups < 1:
        raise ValueError(f"max_groups must be an int >= 1, got {max_groups!r}")
    C, hk = len(bits), n_kv_heads
    if C ** hk > MAX_OPTIONS:
        raise ValueError(f"{C} candidates over {hk} KV heads give {C ** hk} assignments a layer (more than "
                         f"{MAX_OPTIONS}); use fewer candidates or no max_groups")
    opts = [a for a in itertools.product(range(C), repeat=hk) if len(set(a)) <= max_groups]
    n = len(sens) // hk
    osens = [[sum(sens[layer * hk + h][c] for h, c in enumerate(a)) for a in opts] for layer in range(n)]
    obits = [sum(bits[c] for c in a) / hk for a in opts]
    choice = allocate(osens, obits, budget)
    return [c for layer in range(n) for c in opts[choice[layer]]]


def scheme_of_heads(choice: list[int], candidates: list[str], n_kv_heads: int, sink: int = 0,
                    window: int = 0) -> KVScheme:
    """The DSL scheme of a per-(layer, KV head) choice (index l * Hk + h): each layer's most used candidate is the
    layer's pair, the scheme's most used layer pair its base (others `L<i>=`), heads off their layer's pair
    `L<i>.h<j>=`."""
    n = len(choice) // n_kv_heads
    heads = [choice[layer * n_kv_heads:(layer + 1) * n_kv_heads] for layer in range(n)]
    layer_c = [max(set(hs), key=lambda c: (hs.count(c), -c)) for hs in heads]
    sch = scheme_of(layer_c, candidates, sink, window)
    over = tuple((layer, h, *pair(candidates[c])) for layer, hs in enumerate(heads) for h, c in enumerate(hs)
                 if c != layer_c[layer])
    return KVScheme(k=sch.k, v=sch.v, sink=sink, window=window, overrides=sch.overrides, head_overrides=over)


def choose(res: dict, budget: float, head_dim: int) -> dict:
    """`search`'s result re-allocated under another budget from the same sensitivities (and bit accounting, and
    decode-time table and budget when it has them): the best of the `regimes`."""
    cands, sink, ctx, window = res["candidates"], res.get("sink", 0), res.get("context"), res.get("window", 0)
    ms, ms_budget = res.get("ms"), res.get("decode_budget_ms")
    best, err = None, None
    for g, idx in regimes(cands, ctx):
        bits = [_spec_bits(cands[i], head_dim, ctx, sink, g, window) for i in idx]
        sens = [[row[i] for i in idx] for row in res["sens"]]
        sub_ms = None if ms is None else [[row[i] for i in idx] for row in ms]
        try:
            if res.get("max_groups"):  # per head, at most that many distinct pairs a layer
                sub = allocate_heads(sens, bits, budget, res["per_head"], res["max_groups"])
            else:
                sub = allocate(sens, bits, budget, sub_ms, ms_budget)
        except ValueError as e:
            err = e
            continue
        choice = [idx[c] for c in sub]
        kl = sum(res["sens"][layer][c] for layer, c in enumerate(choice))
        if best is None or kl < best[1]:
            best = (choice, kl)
    if best is None:
        raise err
    choice, kl = best
    hk = res.get("per_head")  # per-head sensitivities: one unit per (layer, KV head)
    if hk:
        sch, n = scheme_of_heads(choice, cands, hk, sink, window), len(choice) // hk
    else:
        sch, n = scheme_of(choice, cands, sink, window), len(choice)
    # the chosen scheme's own count (its Gc divides the regime's: never more than the priced bits)
    mean_bits = sch.bits_per_element(head_dim, context=ctx, n_layers=n, n_kv_heads=hk or None) if ctx else \
        sum(_spec_bits(cands[c], head_dim) for c in choice) / len(choice)
    out = {**res, "scheme": str(sch), "choice": [cands[c] for c in choice],
           "predicted_kl": kl, "bits_per_element": mean_bits, "chan_group": sch.chan_group(n)}
    if ms is not None:
        out["decode_ms"] = sum(ms[layer][c] for layer, c in enumerate(choice))
    return out


@torch.no_grad()
def search(model, tokenizer, candidates: list[str], budget: float, *, calib_text: str = "license",
           calib_tokens: int = 1024, calib_segments: int = 1, progress=None, sink: int = 0, window: int = 0,
           context: int | None = None, sens: list | None = None, ms: list | None = None,
           decode_budget_ms: float | None = None, per_head: bool = False, max_groups: int | None = None) -> dict:
    """Sensitivities on `calib_text`, then the allocation under `budget` bits per element (mean over layers:
    nominal, or effective at `context` tokens; `sink` first tokens and `window` recent ones kept full precision in every
    layer, priced in the bits and present when sensitivities are measured; `sens`: a
    sensitivity table measured before, reused; `ms` [layer][candidate] measured decode times (`decode_ms_table`)
    with `decode_budget_ms`: the layers' summed decode time stays within it). Returns {"scheme": text, "choice":
    [candidate per layer], "predicted_kl": summed sensitivities, "bits_per_element", "sens": [[KL]], "candidates",
    "calib_text", "calib_tokens", "calib_segments", "sink", "context"} plus "decode_ms" with a time table (`choose`
    re-allocates it under another budget). `per_head`: sensitivities and the allocation per (layer, KV head)
    (`head_sensitivity`; rows l * Hk + h; the scheme gets `L<i>.h<j>=` overrides; no decode-time budget), with
    `max_groups` at most that many distinct pairs among a layer's heads (`allocate_heads`)."""
    if not candidates:
        raise ValueError("give at least one candidate spec")
    D = model.config.head_dim
    for c in candidates:
        for s in pair(c):
            s.check_head_dim(D)
    if (ms is None) != (decode_budget_ms is None):
        raise ValueError("a decode-time budget needs the decode-time table (ms) and the table needs the budget")
    hk = model.config.n_kv_heads if per_head else 0
    if per_head and ms is not None:
        raise ValueError("a decode-time budget is priced per layer; per-head search takes none")
    if max_groups is not None and not per_head:
        raise ValueError("max_groups limits the pairs among a layer's heads: it needs per_head")
    units = model.config.n_layers * (hk or 1)
    if sens is None:
        segs = segments(text_tokens(tokenizer, calib_text), calib_tokens, calib_segments, prefix=bos_prefix(tokenizer))
        sens = (head_sensitivity if per_head else layer_sensitivity)(model, segs, candidates, progress, sink, window)
    elif len(sens) != units or any(len(r) != len(candidates) for r in sens):
        raise ValueError(f"the sensitivity table is not {units} {'(layer, head)s' if per_head else 'layers'} x "
                         f"{len(candidates)} candidates")
    base = {"sens": sens, "candidates": candidates, "calib_text": calib_text, "calib_tokens": calib_tokens,
            "calib_segments": calib_segments, "sink": sink, "window": window, "context": context,
            **({"per_head": hk} if per_head else {}), **({"max_groups": max_groups} if max_groups else {})}
    if ms is not None:
        base.update(ms=ms, decode_budget_ms=decode_budget_ms)
    return choose(base, budget, D)
