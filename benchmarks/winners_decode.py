"""Decode speed of the quality winners on the GPU (issue 18's `decode_ms_h200`): one decode step's attention over
every layer of the model each winner was searched on, through the public `decode` with default dispatch.

    python benchmarks/winners_decode.py --out DIR [--winners sweeps/results/quality/winners.csv] [--batch 32]
                                        [--context 8192] [--budget 480] [--bound]

A winner is a per-layer scheme (`L<i>=` overrides), so its decode step runs one attention call per layer, each with
that layer's (K spec, V spec); a layer with per-head specs (`L<i>.h<j>=`) one call per group of KV heads sharing a
pair, timed at the group's head counts and summed (the query gather and output scatter between them not counted).
Every distinct (K spec, V spec, context) is gated against the float32 reference (run.py's `gate`) and timed once
(run.py's `decode_cell`: CUDA-graph replay median); a winner's time is the sum over its layers. Gemma 3's sliding
layers hold only their window (512 tokens), its global layers the whole context. In the same process: the bf16
cache through the same `decode`, and cuDNN SDPA on dense bf16 K/V, summed the same way.
Writes DIR/winners_decode.csv (model, scheme, batch, context, decode_ms_h200, bf16_ms, cudnn_bf16_ms,
ratio_vs_bf16, ratio_vs_cudnn, layers_timed, error) and DIR/pairs.csv (one row per timed pair), then
`--candidates` adds every search candidate at every model shape to the pairs timed, so `--sum DIR/pairs.csv --out DIR2`
sums the winners of a later search without the GPU; `--merge DIR/winners_decode.csv` copies decode_ms_h200 into
winners.csv.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

# The attention shapes of the models the search ran on (checked against the loaded configs by
# tests/eval/test_winners_decode.py): layers, query heads, KV heads, head dim, sliding window (None: every layer
# global) and the sliding pattern (every `pattern`-th layer global, as Gemma 3).
MODELS = {"SmolLM2-135M-Instruct": dict(n_layers=30, heads_q=9, heads_kv=3, head_dim=64, window=None, pattern=1),
          "Gemma-3-270M": dict(n_layers=18, heads_q=4, heads_kv=1, head_dim=256, window=512, pattern=6)}
COLUMNS = ["model", "scheme", "batch", "context", "decode_ms_h200", "bf16_ms", "cudnn_bf16_ms", "ratio_vs_bf16",
           "ratio_vs_cudnn", "layers_timed", "error"]
PAIR_COLUMNS = ["k_spec", "v_spec", "window", "sink", "context", "heads_q", "heads_kv", "head_dim", "graph_ms", "gate_rel_err",
                "config", "error"]


def layer_contexts(model: str, context: int) -> list[int]:
    """Tokens each layer's cache holds at `context`: the sliding layers of Gemma 3 only their window."""
    m = MODELS[model]
    return [context if m["window"] is None or (i + 1) % m["pattern"] == 0 else min(context, m["window"])
            for i in range(m["n_layers"])]


def layer_pairs(scheme: str, model: str, context: int) -> list[list[tuple]]:
    """Per layer of `scheme` on `model`: [(K spec, V spec, window, sink, context, Hq, Hk)], one entry per group of KV
    heads sharing a spec pair (one for a layer without per-head specs; a layer with them runs one decode call per
    group, on the group's KV heads and their query heads)."""
    import kvlab
    sch = kvlab.scheme(scheme)
    m = MODELS[model]
    n, g = m["n_layers"], m["heads_q"] // m["heads_kv"]
    return [[(*pair, sch.window, sch.sink, ctx, g * len(heads), len(heads))
             for pair, heads in sch.head_groups(i, n, m["heads_kv"])]
            for i, ctx in enumerate(layer_contexts(model, context))]


def merge(result_csv: str, winners_csv: str) -> int:
    """Copy decode_ms_h200 of `result_csv` into `winners_csv` (rows matched on model and scheme), and the same run's
    bf16 step into bf16_decode_ms_h200 where winners.csv has that column (a row's two times from one run); returns
    rows set."""
    with open(result_csv) as f:
        ms = {(r["model"], r["scheme"]): (r["decode_ms_h200"], r.get("bf16_ms", ""))
              for r in csv.DictReader(f) if r["decode_ms_h200"]}
    with open(winners_csv) as f:
        rd = csv.DictReader(f)
        cols, rows = rd.fieldnames, list(rd)
    n = 0
    for r in rows:
        v = ms.get((r["model"], r["scheme"]))
        if v is not None:
            r["decode_ms_h200"] = f"{float(v[0]):.4f}"
            if "bf16_decode_ms_h200" in r and v[1]:
                r["bf16_decode_ms_h200"] = f"{float(v[1]):.4f}"
            n += 1
    with open(winners_csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    return n


def _key(ks, vs, window, sink, ctx, m, hq=None, hk=None) -> tuple:
    return (str(ks), str(vs), int(window), int(sink), int(ctx), hq or m["heads_q"], hk or m["heads_kv"], m["head_dim"])


def needed_pairs(winners: list[dict], candidates: list[str], context: int,
                 fp: tuple[tuple[int, int], ...] = ((0, 0),)) -> list[tuple]:
    """Every (K spec, V spec, window, sink, context, Hq, Hk, D) that the winners' layers use, then every search
    candidate at every model's layer contexts with each (window, sink) of `fp` (so a later search's winners, with
    those full-precision tokens, can be summed from the same table), plus bf16 at those contexts: the winners' pairs
    first (a time budget skips candidates before winners), each part sorted, without repeats."""
    import kvlab
    first = set()
    for r in winners:
        m = MODELS[r["model"]]
        first |= {_key(*pr[:5], m, *pr[5:]) for parts in layer_pairs(r["scheme"], r["model"], context) for pr in parts}
    rest = set()
    for model, m in MODELS.items():
        for ctx in set(layer_contexts(model, context)):
            for c in candidates + ["bf16"]:
                ks, _, vs = c.partition("|")
                sch = kvlab.scheme(f"k={ks},v={vs or ks}")
                rest |= {_key(sch.k, sch.v, w, s, ctx, m) for w, s in ({(0, 0), *fp} if c != "bf16" else {(0, 0)})}
    return sorted(first) + sorted(rest - first)


def read_pairs(path) -> dict:
    """pairs.csv -> {pair key: graph ms (None where not timed)}: the reader the search's --speed-table uses."""
    from kvlab.eval.search import read_speed_table
    return read_speed_table(path)


def summarize(winners: list[dict], times: dict, cudnn: dict, batch: int, context: int) -> list[dict]:
    """One row per winner: the sum over its layers of the timed pairs (empty where a layer's pair is missing)."""
    import kvlab
    fp = kvlab.scheme("bf16")
    rows = []
    for r in winners:
        m = MODELS[r["model"]]
        layers = layer_pairs(r["scheme"], r["model"], context)
        got = [times.get(_key(*pr[:5], m, *pr[5:])) for parts in layers for pr in parts]  # parts run one by one
        ctxs = [parts[0][4] for parts in layers]
        ref = [times.get(_key(fp.k, fp.v, 0, 0, c, m)) for c in ctxs]
        cud = [cudnn.get((c, m["heads_q"], m["heads_kv"], m["head_dim"])) for c in ctxs]
        row = dict(model=r["model"], scheme=r["scheme"], batch=batch, context=context,
                   layers_timed=f"{sum(g is not None for g in got)}/{len(got)}")
        if all(g is not None for g in got):
            row["decode_ms_h200"] = sum(got)
            if all(x is not None for x in ref):
                row["bf16_ms"] = sum(ref)
                row["ratio_vs_bf16"] = row["decode_ms_h200"] / row["bf16_ms"]
            if all(x is not None for x in cud):
                row["cudnn_bf16_ms"] = sum(cud)
                row["ratio_vs_cudnn"] = row["decode_ms_h200"] / row["cudnn_bf16_ms"]
        else:
            row["error"] = "some layers' pairs were not timed (pairs.csv says why)"
        rows.append(row)
    return rows


def _write(path: Path, cols, rows) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows({k: r.get(k, "") for k in cols} for r in rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out")
    p.add_argument("--winners", default=str(ROOT / "sweeps/results/quality/winners.csv"))
    p.add_argument("--candidates", default="", help="search candidates (comma-separated, KSPEC|VSPEC pairs allowed) "
                   "timed too, at every model's shape")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--budget", type=float, default=480.0, help="seconds; later pairs are skipped, not timed")
    p.add_argument("--bound", action="store_true", help="pass each layer's context (the sliding window or the "
                   "whole context: what the model knows) as decode's max_kv_len")
    p.add_argument("--fp", default="0:0", help="window:sink pairs (comma-separated) the candidates are timed with "
                   "besides none, e.g. 32:0,32:4 for searches with --window 32 [--sink 4]")
    p.add_argument("--sum", default=None, help="a pairs.csv timed before: write DIR/winners_decode.csv for --winners "
                   "from it (no GPU)")
    p.add_argument("--merge", default=None, help="a winners_decode.csv to copy into --winners (no GPU)")
    a = p.parse_args(argv)
    if a.merge:
        print(f"{merge(a.merge, a.winners)} rows of {a.winners} updated")
        return 0
    with open(a.winners) as f:
        winners = [r for r in csv.DictReader(f) if r["model"] in MODELS]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.sum:
        times = read_pairs(a.sum)
        cudnn = {}
        cpath = Path(a.sum).with_name("cudnn.csv")
        with open(cpath) as f:
            for r in csv.DictReader(f):
                cudnn[(int(r["context"]), int(r["heads_q"]), int(r["heads_kv"]), int(r["head_dim"]))] = \
                    float(r["cudnn_bf16_ms"]) if r["cudnn_bf16_ms"] else None
        _write(out / "winners_decode.csv", COLUMNS, summarize(winners, times, cudnn, a.batch, a.context))
        return 0
    import dataclasses
    import os

    import torch

    import kvlab
    from kvlab.kernels import tuned
    from run import GATE_TOL, decode_cell, gate, header, peers
    h = header(out, argparse.Namespace(tuned=None))
    h["command"] = "python benchmarks/winners_decode.py " + " ".join(sys.argv[1:] if argv is None else argv)
    (out / "header.json").write_text(json.dumps(h, indent=1) + "\n")
    tuned.set_cache_path(os.devnull)  # what a new user gets: the shipped configs, no tuned file
    cands = [c.strip() for c in a.candidates.split(",") if c.strip()]
    fp_tokens = tuple(tuple(int(x) for x in v.split(":")) for v in a.fp.split(",") if v.strip())
    keys = needed_pairs(winners, cands, a.context, fp_tokens)
    fp = kvlab.scheme("bf16")
    t0, times, rows = time.time(), {}, []
    print(f"{len(keys)} pairs to time", flush=True)
    for key in keys:
        ks, vs, window, sink, ctx, Hq, Hk, D = key
        row = dict(k_spec=ks, v_spec=vs, window=window, sink=sink, context=ctx, heads_q=Hq, heads_kv=Hk, head_dim=D)
        if time.time() - t0 > a.budget:
            row["error"] = "skipped: time budget"
        else:
            sch = dataclasses.replace(fp, k=kvlab.parse_spec(ks), v=kvlab.parse_spec(vs), window=window, sink=sink, name=None)
            try:
                row["gate_rel_err"] = gate(sch, D, Hq, Hk)
                if not row["gate_rel_err"] <= GATE_TOL:
                    row["error"] = f"gate failed: rel err {row['gate_rel_err']:.3g}; not timed"
                else:
                    _, g, cfg = decode_cell(sch, dict(batch=a.batch, context=ctx, heads_q=Hq, heads_kv=Hk, head_dim=D),
                                            max_kv_len=ctx if a.bound else None)
                    row.update(graph_ms=g, config=cfg)
                    times[key] = g
            except Exception as e:  # noqa: BLE001 - one failing pair is reported, not fatal
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            torch.cuda.empty_cache()
        rows.append(row)
        _write(out / "pairs.csv", PAIR_COLUMNS, rows)  # after every pair: a killed run keeps what it measured
        print(f"{ks:>28s} | {vs:<24s} ctx {ctx:5d} D {D}: {row.get('graph_ms', float('nan')):.4f} ms "
              f"{row.get('error', '')}", flush=True)
    cudnn = {}
    for (ctx, Hq, Hk, D) in sorted({(k[4], *(lambda m: (m["heads_q"], m["heads_kv"], m["head_dim"]))(m))
                                    for k in keys for m in MODELS.values() if m["head_dim"] == k[7]}):
        cudnn[(ctx, Hq, Hk, D)] = peers(dict(batch=a.batch, context=ctx, heads_q=Hq, heads_kv=Hk, head_dim=D))[0]
    _write(out / "cudnn.csv", ["context", "heads_q", "heads_kv", "head_dim", "cudnn_bf16_ms"],
           [dict(context=k[0], heads_q=k[1], heads_kv=k[2], head_dim=k[3], cudnn_bf16_ms=v) for k, v in cudnn.items()])
    _write(out / "winners_decode.csv", COLUMNS, summarize(winners, times, cudnn, a.batch, a.context))
    tuned.set_cache_path(None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
