"""Per-GPU tuned kernel configs: search space, JSON cache, `tune()` entry point.

A config is {"BLOCK_N", "num_warps", "num_stages", "num_splits", "asm"}. The cache key is
op | K spec | V spec | B-bucket | Hq | Hk | D | page size (never the sequence length), stored
per GPU name in ~/.cache/kvlab/tuned_<gpu>.json (override: env KVLAB_TUNED_CONFIGS or
`set_cache_path`). On CPU / under TRITON_INTERPRET=1, `tune` returns the default without timing.
This module imports neither Triton nor the kernels at import time.
"""
from __future__ import annotations

import json
import math
import os
import re

import torch

_PATH: str | None = None
_MEM: dict[str, dict] | None = None
B_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def gpu_name(device=None) -> str:
    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1":
        return torch.cuda.get_device_name(device)
    return "cpu"


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", s).strip("_").lower()


def cache_path(device=None) -> str:
    if _PATH:
        return _PATH
    env = os.environ.get("KVLAB_TUNED_CONFIGS")
    if env:
        return env
    return os.path.join(os.path.expanduser("~"), ".cache", "kvlab", f"tuned_{_slug(gpu_name(device))}.json")


def set_cache_path(path: str | None) -> None:
    """Use `path` as the tuned-config JSON file (None: back to the default)."""
    global _PATH, _MEM
    _PATH, _MEM = path, None


def _load() -> dict:
    global _MEM
    if _MEM is None:
        p = cache_path()
        try:
            with open(p) as f:
                _MEM = json.load(f).get("configs", {})
        except (OSError, ValueError):
            _MEM = {}
    return _MEM


def _save() -> None:
    p = cache_path()
    os.makedirs(os.path.dirname(p) or ".", exist_ok=True)
    tmp = p + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"gpu": gpu_name(), "configs": _load()}, f, indent=1, sort_keys=True)
    os.replace(tmp, p)


def b_bucket(B: int) -> int:
    return next((b for b in B_BUCKETS if B <= b), B_BUCKETS[-1])


def key(op: str, k_spec, v_spec, B: int, Hq: int, Hk: int, D: int, page_size: int) -> str:
    return f"{op}|k={k_spec}|v={v_spec}|B{b_bucket(B)}|Hq{Hq}|Hk{Hk}|D{D}|P{page_size}"


def num_sms(device=None) -> int:
    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1":
        return torch.cuda.get_device_properties(device or 0).multi_processor_count
    return 4


def auto_splits(B: int, Hk: int, device=None, waves: int = 2, max_splits: int = 64) -> int:
    """Split count so that B * Hk * splits covers `waves` programs per SM (132 SMs on H200)."""
    return max(1, min(max_splits, math.ceil(waves * num_sms(device) / max(1, B * Hk))))


def default_config(op: str, B: int, Hk: int, device=None) -> dict:
    return {"BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "num_splits": None, "asm": False}


def lookup(op: str, k_spec, v_spec, B, Hq, Hk, D, page_size, device=None) -> dict | None:
    """The cached best config for this shape and spec, or None."""
    return _load().get(key(op, k_spec, v_spec, B, Hq, Hk, D, page_size))


def record(op: str, k_spec, v_spec, B, Hq, Hk, D, page_size, config: dict, ms: float | None, save: bool = True):
    _load()[key(op, k_spec, v_spec, B, Hq, Hk, D, page_size)] = {**config, "ms": ms}
    if save:
        _save()


def export_configs(path: str) -> str:
    """Write every cached config (with the GPU name) to `path` as JSON; returns path."""
    with open(path, "w") as f:
        json.dump({"gpu": gpu_name(), "configs": _load()}, f, indent=1, sort_keys=True)
    return path


def search_space(op: str, B: int, Hk: int, k_spec, v_spec, device=None, asm_ok: bool = True) -> list[dict]:
    """Pruned candidates: tile size x warps (stages fixed by tile), splits around the auto count."""
    base = auto_splits(B, Hk, device)
    cands = []
    for bn, warps, stages in ((32, 4, 2), (64, 4, 2), (64, 4, 3), (128, 4, 2), (128, 8, 2)):
        cands.append({"BLOCK_N": bn, "num_warps": warps, "num_stages": stages, "num_splits": base, "asm": False})
    quant4 = any(s.fmt == "int" and s.bits == 4 and s.axis != "chan" for s in (k_spec, v_spec))
    if asm_ok and quant4:
        cands += [{**c, "asm": True} for c in cands[1:4]]
    return cands


def split_space(best: dict, B: int, Hk: int, device=None) -> list[dict]:
    base = best["num_splits"]
    outs = sorted({max(1, base // 2), base, min(128, base * 2)} - {base})
    return [{**best, "num_splits": s} for s in outs]
