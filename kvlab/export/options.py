"""The table users want: every engine's KV-cache option on the real model, under its engine profile.

    python -m kvlab.export options [--out sweeps/results/engines/options.csv] [--tokens 2048] [--segments 4]
                                   [--engines llama.cpp,vllm,sglang,freetoken]

Each profile of kvlab.spec.engines (llama.cpp's types with and without rotation, vLLM 0.33's, SGLang 0.5.23's
and FreeToken's options) is scored decode-faithfully on SmolLM2-135M over disjoint pydoc segments (every
position's KL to the full-precision model, PPL delta, top-1 agreement; mean and sd over segments), beside its
stored bits per element (scales and full-precision layers amortized, at SmolLM2's head_dim 64) and the engine
command that runs it. Rows are written as they finish; `kvlab.export` reads the file to state the cost of
an exported option and to rank substitutes.
"""
from __future__ import annotations

import csv
import time
from pathlib import Path

from ..spec import as_scheme
from ..spec.engines import all_profiles

COLUMNS = ["engine", "option", "profile", "runs_on", "exact_bytes", "bits_per_element", "kl", "kl_sd", "ppl",
           "ppl_sd", "ppl_delta_pct", "ppl_delta_pct_sd", "top1", "top1_sd", "model", "text", "tokens", "segments",
           "source", "seconds"]
DEFAULT_OUT = "sweeps/results/engines/options.csv"


def runs_on(profile) -> str:
    """The engine command line (and where it runs) that the profile models."""
    o = profile.option
    if profile.engine == "llama.cpp":
        ck, _, cv = o.partition("/")
        env = "LLAMA_ATTN_ROT_DISABLE=1 " if profile.suffix == ":norot" else ""
        return f"{env}llama.cpp -ctk {ck} -ctv {cv or ck} -fa on (CPU)"
    if profile.engine == "vllm":
        where = {"fp8": "FlashAttention-3 on SM90", "fp8_e4m3": "FlashAttention-3 on SM90",
                 "fp8_e5m2": "FlashInfer", "nvfp4": "FlashInfer", "nvfp4_4over6": "FlashInfer"}.get(o, "Triton")
        return f"vllm serve --kv-cache-dtype {o} ({where})"
    if profile.engine == "sglang":
        return f"python -m sglang.launch_server --kv-cache-dtype {o} (fa3 on SM90)"
    return f"ft serve --kv-cache-dtype {o} --attention-backend triton"


def score_options(profiles=None, tokens: int = 2048, segments: int = 4, out: str | None = DEFAULT_OUT,
                  log=print) -> list[dict]:
    """Rows of COLUMNS for `profiles` (default: every engine profile), written to `out` as they finish."""
    from ..eval.perplexity import evaluate_scheme
    from ..model import load_model
    model, tok = load_model("smollm2")
    names = list(profiles or all_profiles())
    f = w = None
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        f = open(out, "w", newline="")
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
    rows = []
    try:
        for name in names:
            sch = as_scheme(name)
            p = sch.engine
            t0 = time.time()
            r = evaluate_scheme(model, tok, sch, n_tokens=tokens, n_segments=segments)
            row = {"engine": p.engine, "option": p.option + p.suffix, "profile": p.name, "runs_on": runs_on(p),
                   "exact_bytes": p.exact, "bits_per_element": round(r["eff_bits_per_element"], 4),
                   "model": "SmolLM2-135M-Instruct", "text": r["text"], "tokens": tokens, "segments": segments,
                   "source": p.source, "seconds": round(time.time() - t0, 1)}
            for k in ("kl", "ppl", "ppl_delta_pct", "top1"):
                row[k], row[k + "_sd"] = r[k], r[k + "_sd"]
            rows.append(row)
            log(f"{p.name:28s} {row['bits_per_element']:6.3f} b/el  KL {row['kl']:.5f}  PPL {row['ppl_delta_pct']:+7.2f}% "
                f"+- {row['ppl_delta_pct_sd']:.2f}  ({row['seconds']} s)")
            if w:
                w.writerow(row)
                f.flush()
    finally:
        if f:
            f.close()
    return rows


def read_options(path: str | Path = DEFAULT_OUT) -> dict[str, dict]:
    """profile name -> row of a committed options table ({} when the file is absent)."""
    p = Path(path)
    if not p.is_file():
        return {}
    with open(p, newline="") as f:
        return {r["profile"]: r for r in csv.DictReader(f)}


def markdown(path: str | Path = DEFAULT_OUT) -> str:
    """The options table as Markdown (the README's engine table is this, pasted)."""
    rows = list(read_options(path).values())
    out = ["| engine option (profile) | bits/el | KL | PPL delta % (sd) | runs on |", "|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| `{r['profile']}` | {float(r['bits_per_element']):.2f} | {float(r['kl']):.4f} | "
                   f"{float(r['ppl_delta_pct']):+.2f} ({float(r['ppl_delta_pct_sd']):.2f}) | {r['runs_on']} |")
    return "\n".join(out)
