"""What an option costs on the real model, from committed result files: the engine-options table
(`python -m kvlab.export options`: every engine's cache option under its engine profile) and the default
GPU sweep's per-scheme table (decode-faithful KL and PPL on SmolLM2). `kvlab.export` states the exported
option's cost and ranks substitutes with these; an option missing from both is scored only with --model.
"""
from __future__ import annotations

import csv
import functools
from pathlib import Path

ROOTS = (Path(__file__).resolve().parents[2], Path.cwd())  # the source checkout (editable install), then cwd
OPTIONS = "sweeps/results/engines/options.csv"
SCHEMES = "sweeps/results/h200/default-gpu/schemes.csv"


def _find(rel: str) -> Path | None:
    return next((r / rel for r in ROOTS if (r / rel).is_file()), None)


@functools.lru_cache(maxsize=None)
def _table(rel: str, key: str) -> dict[str, dict]:
    path = _find(rel)
    if path is None:
        return {}
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    out = {}
    for r in rows:
        for k in (r.get(key), r.get("name")):
            if k:
                out.setdefault(k, {**r, "file": rel})
    return out


def _cost(r: dict, what: str) -> dict:
    kl = float(r["kl"] if "kl" in r else r["loss"])
    return {"what": what, "kl": kl, "kl_sd": float(r.get("kl_sd") or r.get("loss_sd") or 0),
            "ppl_delta_pct": float(r["ppl_delta_pct"]), "ppl_delta_pct_sd": float(r["ppl_delta_pct_sd"]),
            "bits_per_element": float(r.get("bits_per_element") or r.get("eff_bits") or 0),
            "model": r.get("model", "SmolLM2-135M-Instruct"), "file": r["file"]}


def profile_cost(profile: str) -> dict | None:
    """KL / PPL delta of an engine profile (`vllm:fp8_e4m3`) on SmolLM2, or None when not in the table."""
    r = _table(OPTIONS, "profile").get(profile)
    return _cost(r, f"engine profile {profile}") if r else None


def scheme_cost(scheme) -> dict | None:
    """KL / PPL delta of a kvlab scheme (by its text or preset name) in the default GPU sweep, or None."""
    t = _table(SCHEMES, "scheme")
    for key in (str(scheme), getattr(scheme, "name", None)):
        if key and key in t and t[key].get("loss_metric", "kl") == "kl":
            return _cost(t[key], f"kvlab scheme {key}")
    return None


def engine_profile(engine: str, label: str) -> str | None:
    """The profile name of an engine's cache option label (`q4_0`, `fp8_e4m3`, `k=q8_0,v=q4_0`)."""
    if engine not in ("llama.cpp", "vllm", "sglang", "freetoken") or label.startswith("auto"):
        return None
    if label.startswith("k="):
        k, v = (p.split("=", 1)[1] for p in label.split(","))
        label = k if k == v else f"{k}/{v}"
    return f"{engine}:{label}"
