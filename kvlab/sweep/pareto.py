"""Pareto frontier over (effective bits/element, quality loss with its spread, decode time).

Quality loss per scheme, best available: KL(full || quantized) from the model stage (mean and sd
over segments), else the attention-output rel-L2 (K and V quantized), else the round-trip rel-L1
on student_t4. A point dominates another only when it is no worse on every axis and better on
one: fewer bits, less time, or a loss lower by more than the measured spread
sqrt(sd_a^2 + sd_b^2). Differences inside the noise never rank two schemes.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd


def scheme_table(results: pd.DataFrame) -> pd.DataFrame:
    """One row per scheme: bits, eff_bits, loss, loss_sd, loss_metric, decode_ms (if timed)."""
    ok = results[results["status"] == "ok"] if "status" in results else results
    rows = {}
    for scheme, g in ok.groupby("scheme", sort=False):
        r = {"scheme": scheme, "name": g["name"].iloc[0]}
        bits = g["bits_per_element"].dropna() if "bits_per_element" in g else pd.Series(dtype=float)
        r["bits"] = float(bits.iloc[0]) if len(bits) else math.nan
        m = g[g["stage"] == "model"]
        a = g[g["stage"] == "attention"]
        rt = g[(g["stage"] == "roundtrip") & (g["shape"] == "student_t4")]
        if len(m) and "kl" in m:
            eff = _amortized(scheme, r["bits"], m["params"].iloc[0], m["eff_bits_per_element"].iloc[0])
            mb = m["bits_per_element"].iloc[0] if "bits_per_element" in m else math.nan
            if pd.notna(mb):  # the model stage counts every layer and head (overrides); other stages the base pair
                r["bits"] = float(mb)
            r.update(eff_bits=float(eff), loss=float(m["kl"].iloc[0]),
                     loss_sd=float(m["kl_sd"].iloc[0]), loss_metric="kl",
                     ppl_delta_pct=float(m["ppl_delta_pct"].iloc[0]), ppl_delta_pct_sd=float(m["ppl_delta_pct_sd"].iloc[0]))
        elif len(a) and "attn_kv_rel_l2" in a:
            eff = a["eff_bits_per_element"].iloc[0] if "eff_bits_per_element" in a else math.nan
            eff = _amortized(scheme, r["bits"], a["params"].iloc[0], eff)
            r.update(eff_bits=float(eff), loss=float(a["attn_kv_rel_l2"].iloc[0]), loss_sd=0.0,
                     loss_metric="attn_rel_l2")
        elif len(rt) and "rel_l1" in rt:
            r.update(eff_bits=r["bits"], loss=float(rt["rel_l1"].iloc[0]), loss_sd=0.0, loss_metric="roundtrip_rel_l1")
        else:
            continue
        sp = g[g["stage"] == "speed"]
        r["decode_ms"] = float(sp["decode_ms"].iloc[0]) if len(sp) and "decode_ms" in sp else math.nan
        rows[scheme] = r
    return pd.DataFrame(list(rows.values()))


LAYERS = {"smollm2": 30, "gemma3": 18}  # the evaluated models' layer counts (their GGUF configs), for overrides


def _amortized(scheme: str, bits: float, params: str, stored: float = math.nan) -> float:
    """Effective bits of a scheme over the cell's token count, recomputed with today's accounting (sinks, window and
    the scheme's unfinished channel group in bf16 in every layer), so rows written under an older count compare
    fairly; `stored` (the row's own value) where the row lacks what that needs (its token count; the model's layer
    count for a scheme with overrides)."""
    import json

    from ..spec import as_scheme
    s = as_scheme(scheme)
    p = json.loads(params)
    tokens, n_layers = p.get("tokens"), LAYERS.get(p.get("model"))
    if not tokens or (s.overrides and n_layers is None):
        return bits if pd.isna(stored) else stored
    for d in (64, 128, 80, 96, 256):  # the head_dim the row's bits were computed at
        try:
            if abs(s.bits_per_element(d) - bits) < 1e-9:
                return s.bits_per_element(d, context=tokens, n_layers=n_layers if s.overrides else None)
        except ValueError:
            continue
    return bits if pd.isna(stored) else stored


def dominates(a: pd.Series, b: pd.Series) -> bool:
    spread = math.hypot(a["loss_sd"], b["loss_sd"])
    not_worse = a["eff_bits"] <= b["eff_bits"] and a["loss"] <= b["loss"] + spread
    better = a["eff_bits"] < b["eff_bits"] or a["loss"] < b["loss"] - spread
    if not (math.isnan(a["decode_ms"]) or math.isnan(b["decode_ms"])):
        not_worse = not_worse and a["decode_ms"] <= b["decode_ms"]
        better = better or a["decode_ms"] < b["decode_ms"]
    return not_worse and better


def frontier(table: pd.DataFrame) -> pd.DataFrame:
    """The non-dominated schemes of `scheme_table`, sorted by effective bits."""
    if table.empty:
        return table
    keep = [i for i, b in table.iterrows() if not any(dominates(a, b) for j, a in table.iterrows() if j != i)]
    return table.loc[keep].sort_values(["eff_bits", "loss"]).reset_index(drop=True)


def format_table(front: pd.DataFrame) -> str:
    if front.empty:
        return "(no scheme has a quality result yet)"
    metric = front["loss_metric"].iloc[0]
    lines = [f"{'scheme':50s} {'bits':>6s} {'eff':>6s} {metric:>20s} {'dPPL%':>14s} {'decode ms':>9s}"]
    for _, r in front.iterrows():
        dppl = f"{r['ppl_delta_pct']:+.2f}+-{r['ppl_delta_pct_sd']:.2f}" if "ppl_delta_pct" in r and not pd.isna(r.get("ppl_delta_pct")) else "-"
        ms = f"{r['decode_ms']:.3f}" if not pd.isna(r["decode_ms"]) else "-"
        lines.append(f"{str(r['name'])[:50]:50s} {r['bits']:6.3f} {r['eff_bits']:6.3f} "
                     f"{r['loss']:>11.5f}+-{r['loss_sd']:<7.5f} {dppl:>14s} {ms:>9s}")
    return "\n".join(lines)


def plot(table: pd.DataFrame, front: pd.DataFrame, path: Path, title: str = "", time_label: str = "decode time, ms") -> None:
    """The Pareto view (kvlab.report.pareto_panels): bits vs loss and decode time vs loss, families colored,
    frontier points numbered and named in a table beside the panels (the notebooks and the paper draw the
    same figure)."""
    from ..report import pareto_panels
    pareto_panels(table, path, title=title or "kvlab sweep: Pareto frontier", time_label=time_label)


def report(results_dir: str | Path, quiet: bool = False) -> pd.DataFrame:
    """Rebuild pareto.csv and pareto.png from a results directory; print the table."""
    from .results import SweepResults
    d = Path(results_dir)
    if not (d / "cells.jsonl").exists() and not (d / "results.parquet").exists():
        raise ValueError(f"{d} holds no sweep results (no cells.jsonl or results.parquet)")
    df = SweepResults(d).table() if (d / "cells.jsonl").exists() else pd.read_parquet(d / "results.parquet")
    table = scheme_table(df)
    if not table.empty:  # rank only on one loss metric: the one most schemes have
        metric = table["loss_metric"].value_counts().idxmax()
        table = table[table["loss_metric"] == metric].reset_index(drop=True)
    front = frontier(table)
    table.to_csv(d / "schemes.csv", index=False)
    front.to_csv(d / "pareto.csv", index=False)
    if not table.empty:
        sp = df[df["stage"] == "speed"] if "stage" in df else df.iloc[:0]
        shape = sp["shape"].iloc[0] if len(sp) and "shape" in sp else ""
        gpu = sp["gpu"].dropna().iloc[0] if len(sp) and "gpu" in sp and sp["gpu"].notna().any() else ""
        plot(table, front, d / "pareto.png", title=f"{d.name}: {len(front)} of {len(table)} schemes on the frontier",
             time_label=f"decode time, ms ({gpu} {shape}, graph replay)".replace(" ()", "").replace("( ", "("))
    if not quiet:
        print(format_table(front))
    return front
