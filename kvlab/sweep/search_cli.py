"""`python -m kvlab.sweep search`: the scheme that loses least under a bit budget, found and then evaluated.

    python -m kvlab.sweep search --budget 3.5[,2.5,...] [--candidates lm2:rot=had,lm3:rot=had,lm4:rot=had]
                                 [--calib-text license] [--calib-tokens 1024] [--text pydoc] [--tokens 2048]
                                 [--segments 4] [--sink N] [--window N] [--nominal-bits] [--sensitivity CSV]
                                 [--speed-table PAIRS_CSV --decode-budget 1.0x|MS] [--speed-context 8192]
                                 [--per-head [--max-groups N]]
                                 [--model smollm2] [--device cpu|cuda] [--out DIR]

Measures each layer's sensitivity to each candidate on the calibration text (`kvlab.eval.search`), allocates
one candidate per layer under each budget (effective bits per element, mean over layers; several budgets
share one sensitivity table), prints the chosen scheme as one DSL line, then evaluates it on the held-out text
like `python -m kvlab.eval` (PPL delta with sd over segments, KL, effective bits). With --out, writes
DIR/sensitivity.csv (layer x candidate KL) and DIR/search.json (per budget: the choice, both texts, the
held-out scores).

With --speed-table (a pairs.csv of benchmarks/winners_decode.py, measured on the GPU) and --decode-budget, the
allocation also keeps one decode step's attention time, summed over layers at --speed-context tokens, within the
budget: in ms, or as a multiple of the bf16 cache's time from the same table ("1.0x": no slower than bf16).

With --per-head, every unit of the search is one KV head of one layer: its sensitivity is measured with that head
alone quantized, and the allocation may give the heads of one layer different candidates (`L<i>.h<j>=` overrides;
the pool keeps one page set per group of heads). Candidates must keep no calibrated state (no smoothing,
permutation, calibrated codebook or static scale).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEFAULT_CANDIDATES = "lm2:rot=had,lm3:rot=had,lm4:rot=had"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvlab.sweep search", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget", required=True, help="mean effective bits per element over layers (comma-separated: "
                   "several budgets over one sensitivity table)")
    p.add_argument("--candidates", default=DEFAULT_CANDIDATES, help="comma-separated specs (K and V of a layer)")
    p.add_argument("--calib-text", default="license", choices=["license", "pydoc"])
    p.add_argument("--calib-tokens", type=int, default=1024)
    p.add_argument("--text", default="pydoc", choices=["pydoc", "license"], help="held-out evaluation text")
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--segments", type=int, default=4)
    p.add_argument("--sink", type=int, default=0, help="first tokens kept full precision in every layer")
    p.add_argument("--window", type=int, default=0, help="recent tokens kept full precision in every layer (KIVI's "
                   "residual): priced in the effective bits and present when sensitivities are measured; a reused "
                   "--sensitivity table must have been measured with the same window")
    p.add_argument("--sensitivity", default=None, help="reuse a sensitivity.csv of an earlier run (same calibration "
                   "text and tokens): its candidates' columns are reused, the others measured and added")
    p.add_argument("--nominal-bits", action="store_true", help="budget in nominal bits (default: effective bits at "
                   "--tokens, full-precision tokens counted, as the evaluation reports them)")
    p.add_argument("--speed-table", default=None, help="pairs.csv of measured decode times (benchmarks/"
                   "winners_decode.py) for a decode-time budget")
    p.add_argument("--decode-budget", default=None, help="summed decode ms over layers, or NUMx: that multiple of "
                   "the bf16 cache's time in the same table")
    p.add_argument("--speed-context", type=int, default=8192, help="context of the speed table's rows")
    p.add_argument("--per-head", action="store_true", help="sensitivities and choices per (layer, KV head): the "
                   "scheme gets L<i>.h<j>= overrides (Hk times the forwards; candidates without calibrated state; "
                   "sensitivity.csv rows are layer.head)")
    p.add_argument("--max-groups", type=int, default=None, help="with --per-head: at most this many distinct "
                   "pairs among a layer's KV heads (each is one page set and one attention launch a step)")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--out", default=None)
    return p


def decode_budget(table: str, config, cands: list[str], context: int, sink: int, budget: str, window: int = 0) -> tuple:
    """(ms[layer][candidate], budget in ms) from a speed table; budget "NUMx" is NUM times the bf16 cache's
    summed time from the same table."""
    from ..eval.search import decode_ms_table
    ms = decode_ms_table(table, config, cands, context, sink, window)
    missing = sorted({cands[c] for row in ms for c, v in enumerate(row) if v is None})
    if missing:
        raise ValueError(f"{table} has no timed row at this model's shape and context {context} for: "
                         f"{', '.join(missing)}")
    try:
        value = float(budget[:-1] if budget.endswith("x") else budget)
    except ValueError:
        raise ValueError(f"--decode-budget {budget!r} must be a number of ms or NUMx (a multiple of bf16)") from None
    if not budget.endswith("x"):
        return ms, value
    ref = decode_ms_table(table, config, ["bf16"], context, 0)
    if any(r[0] is None for r in ref):
        raise ValueError(f"{table} has no bf16 row at this model's shape and context {context}")
    return ms, value * sum(r[0] for r in ref)


def reuse_sensitivity(path: str, cands: list[str], model, tok, calib_text: str, calib_tokens: int, sink: int,
                      window: int, bar, per_head: bool = False) -> list[list[float]]:
    """The sensitivity table for `cands` from an earlier run's sensitivity.csv: its columns are reused, candidates it
    lacks are measured now (the same way: KL on `calib_tokens` of `calib_text`) and added. The earlier run must have
    measured on the same calibration text, token count, sinks and window (the caller's arguments; not checked)."""
    from ..eval.perplexity import bos_prefix, segments, text_tokens
    from ..eval.search import head_sensitivity, layer_sensitivity
    with open(path) as f:
        head, *lines = f.read().split("\n")
    have = head.split(",")[1:]
    table = [[float(v) for v in ln.split(",")[1:]] for ln in lines if ln.strip()]
    labels = [ln.split(",")[0] for ln in lines if ln.strip()]
    cfg = model.config
    units = cfg.n_layers * (cfg.n_kv_heads if per_head else 1)
    if len(table) != units or any(("." in lab) != per_head for lab in labels):
        raise ValueError(f"{path} has {len(table)} rows ({labels[:1]} ...); this {'per-head ' * per_head}search "
                         f"needs {units} ({'layer.head' if per_head else 'layer'} rows)")
    missing = [c for c in cands if c not in have]
    bar.total = units * len(missing)
    bar.refresh()
    got = {}
    if missing:
        segs = segments(text_tokens(tok, calib_text), calib_tokens, 1, prefix=bos_prefix(tok))
        new = (head_sensitivity if per_head else layer_sensitivity)(model, segs, missing, bar.update, sink, window)
        got = {c: [row[i] for row in new] for i, c in enumerate(missing)}
    col = {c: [row[have.index(c)] for row in table] if c in have else got[c] for c in cands}
    return [[col[c][u] for c in cands] for u in range(units)]


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    import torch
    from tqdm import tqdm

    from ..eval.perplexity import evaluate_scheme
    from ..eval.search import choose, search
    from ..model import load_model
    cands = [c.strip() for c in a.candidates.split(",") if c.strip()]
    runs = []
    try:
        budgets = [float(b) for b in a.budget.split(",")]
        if a.text == a.calib_text:
            raise ValueError(f"--text and --calib-text are both {a.text}: evaluate on text the search did not see")
        if (a.speed_table is None) != (a.decode_budget is None):
            raise ValueError("--speed-table and --decode-budget go together")
        model, tok = load_model(a.model, device=a.device, dtype=torch.float32)
        hk = model.config.n_kv_heads if a.per_head else 1
        bar = tqdm(total=model.config.n_layers * hk * len(cands), desc="sensitivity", unit="fwd")
        sens = None
        if a.sensitivity:
            sens = reuse_sensitivity(a.sensitivity, cands, model, tok, a.calib_text, a.calib_tokens, a.sink, a.window,
                                     bar, a.per_head)
        ms = ms_budget = None
        if a.speed_table:
            ms, ms_budget = decode_budget(a.speed_table, model.config, cands, a.speed_context, a.sink, a.decode_budget,
                                          a.window)
        res = search(model, tok, cands, max(budgets), calib_text=a.calib_text, calib_tokens=a.calib_tokens,
                     progress=bar.update, sink=a.sink, window=a.window, context=None if a.nominal_bits else a.tokens,
                     sens=sens, ms=ms, decode_budget_ms=ms_budget, per_head=a.per_head, max_groups=a.max_groups)
        bar.close()
        if a.out:  # the measured table first: an evaluation that fails later must not lose it
            out = Path(a.out)
            out.mkdir(parents=True, exist_ok=True)
            with open(out / "sensitivity.csv", "w") as f:
                f.write("layer," + ",".join(cands) + "\n")
                for u, row in enumerate(res["sens"]):
                    label = f"{u // hk}.{u % hk}" if a.per_head else str(u)
                    f.write(f"{label}," + ",".join(f"{v:.6g}" for v in row) + "\n")
        for budget in budgets:
            try:
                r = res if budget == max(budgets) else choose(res, budget, model.config.head_dim)
            except ValueError as e:  # this budget is infeasible (e.g. no candidates that cheap and that fast)
                print(f"no choice under {budget} bits/element: {e}", flush=True)
                runs.append({"budget": budget, "model": a.model, "infeasible": str(e)})
                if a.out:
                    (Path(a.out) / "search.json").write_text(json.dumps(runs, indent=1))
                continue
            print(f"chosen under {budget} bits/element ({r['bits_per_element']:.3f}): {r['scheme']}")
            print(f"predicted KL (sum of the sensitivities on {a.calib_text}): {r['predicted_kl']:.4f}")
            if "decode_ms" in r:
                print(f"decode step (sum over layers, {a.speed_table}): {r['decode_ms']:.4f} ms, budget "
                      f"{r['decode_budget_ms']:.4f} ms")
            ev = evaluate_scheme(model, tok, r["scheme"], text=a.text, n_tokens=a.tokens, n_segments=a.segments,
                                 calib_text=a.calib_text)
            print(f"held out ({a.text}, {a.segments} x {a.tokens} tokens): PPL {ev['ppl_delta_pct']:+.2f}% "
                  f"+- {ev['ppl_delta_pct_sd']:.2f}, KL {ev['kl']:.4f}, {ev['eff_bits_per_element']:.3f} effective "
                  "bits", flush=True)
            runs.append({**{k: v for k, v in r.items() if k not in ("sens", "ms")}, "budget": budget,
                         "model": a.model, "eval": ev, **({"speed_table": a.speed_table} if ms else {})})
            if a.out:  # after every budget: a later one that fails keeps the earlier results
                (Path(a.out) / "search.json").write_text(json.dumps(runs, indent=1))
    except (ValueError, FileNotFoundError) as e:
        print(f"python -m kvlab.sweep search: error: {e}", file=sys.stderr)
        return 2
    return 0
