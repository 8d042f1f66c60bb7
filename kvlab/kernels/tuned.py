"""The tuned-config store: the best measured config per GPU, op, spec and shape, in one JSON file.

Keys never hold a sequence length (the same config serves every context); a store key holds the written token
count's bucket (a decode step's few tokens and a prefill's thousands want different tiles):

    decode|k=SPEC|v=SPEC|B<bucket>|Hq..|Hk..|D..|P..       attention_key("decode", ...); extend alike
    store|SPEC|Hk..|D..|T<bucket>                           store_key(...): T256, T4096 or Tmax

Values are typed configs (`configs.py`) with the median they measured. The user's file is per GPU name:
~/.cache/kvlab/tuned_<gpu>.json, or env KVLAB_TUNED_CONFIGS, or `set_cache_path`; `tune()` writes there.
Beneath it, configs measured on the GPUs we benchmark ship with the package (kvlab/kernels/data/
tuned_<gpu>.json, as serving engines ship per-device kernel configs): a lookup takes the user's entry, else
the packaged one (env KVLAB_PACKAGED_CONFIGS=0 turns those off). `nearest` serves a batch bucket nobody tuned
from the closest tuned one. Files written before format 2 (configs as bare dicts) are read too. Imports no
kernel code and no Triton.
"""
from __future__ import annotations

import functools
import json
import math
import os
import re

from .configs import config_from_dict, t_bucket
from .env import gpu_name

FORMAT = 2
B_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_PATH: str | None = None
_MEM: dict[str, dict] | None = None
_PKG: dict[str, dict] | None = None
_PARSED: dict[tuple, object] = {}  # (key, packaged | "nearest") -> typed config or None: lookups sit on hot paths
DATA_DIR = os.path.join(os.path.dirname(__file__), "data")


def b_bucket(B: int) -> int:
    """The batch bucket a batch of B sequences is tuned under (the next of B_BUCKETS, 256 above)."""
    return next((b for b in B_BUCKETS if B <= b), B_BUCKETS[-1])


@functools.lru_cache(maxsize=1024)
def attention_key(op: str, k_spec, v_spec, B: int, Hq: int, Hk: int, D: int, page_size: int) -> str:
    """Key of a decode or extend config."""
    return f"{op}|k={k_spec}|v={v_spec}|B{b_bucket(B)}|Hq{Hq}|Hk{Hk}|D{D}|P{page_size}"


@functools.lru_cache(maxsize=1024)
def store_key(spec, Hk: int, D: int, tokens: int = 32768) -> str:
    """Key of a store config for writes of `tokens` tokens (its bucket, `t_bucket`)."""
    return f"store|{spec}|Hk{Hk}|D{D}|T{t_bucket(tokens)}"


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", s).strip("_").lower()


def cache_path(device=None) -> str:
    """The JSON file this process reads and writes."""
    if _PATH:
        return _PATH
    return os.environ.get("KVLAB_TUNED_CONFIGS") or os.path.join(
        os.path.expanduser("~"), ".cache", "kvlab", f"tuned_{_slug(gpu_name(device))}.json")


def packaged_path(device=None) -> str:
    """The packaged tuned-config file for this GPU (it may not exist: only benchmarked GPUs have one)."""
    return os.path.join(DATA_DIR, f"tuned_{_slug(gpu_name(device))}.json")


def set_cache_path(path: str | None) -> None:
    """Use `path` as the tuned-config JSON file (None: back to the default)."""
    global _PATH, _MEM, _PKG
    _PATH, _MEM, _PKG = path, None, None
    _PARSED.clear()


def _load() -> dict:
    global _MEM
    if _MEM is None:
        try:
            with open(cache_path()) as f:
                _MEM = json.load(f).get("configs", {})
        except (OSError, ValueError):
            _MEM = {}
    return _MEM


def _dump(path: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"format": FORMAT, "gpu": gpu_name(), "configs": _load()}, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def _packaged() -> dict:
    global _PKG
    if _PKG is None:
        _PKG = {}
        if os.environ.get("KVLAB_PACKAGED_CONFIGS", "1") != "0":
            try:
                with open(packaged_path()) as f:
                    _PKG = json.load(f).get("configs", {})
            except (OSError, ValueError):
                pass
    return _PKG


def _entry(key: str, packaged: bool) -> dict | None:
    e = _load().get(key)
    return _packaged().get(key) if e is None and packaged else e


def lookup(key: str, packaged: bool = True):
    """The config for `key` (a typed config) from the user's file, else (packaged=True) the package's, or
    None. An entry this kvlab cannot read is skipped."""
    if (key, packaged) not in _PARSED:
        entry = _entry(key, packaged)
        try:
            _PARSED[key, packaged] = None if entry is None else config_from_dict(
                key.split("|", 1)[0], {k: v for k, v in entry.items() if k != "ms"})
        except ValueError:
            _PARSED[key, packaged] = None
    return _PARSED[key, packaged]


def nearest(key: str):
    """For an attention key with no entry: the config tuned at the closest batch bucket of the same specs and
    shape (user's file first, then the package's), with num_splits cleared (the split count follows the
    batch: `configs.auto_splits` picks it); None when no bucket of that shape is tuned."""
    if (key, "nearest") not in _PARSED:  # cached like lookups: decode resolves on every unplanned call
        _PARSED[key, "nearest"] = _nearest(key)
    return _PARSED[key, "nearest"]


def _nearest(key: str):
    m = re.fullmatch(r"(.*)\|B(\d+)(\|.*)", key)
    if m is None:
        return None
    head, b, tail = m.group(1), int(m.group(2)), m.group(3)
    for other in sorted(B_BUCKETS, key=lambda x: (abs(math.log2(x) - math.log2(b)), -x)):
        cfg = lookup(f"{head}|B{other}{tail}") if other != b else None
        if cfg is not None:
            return cfg.replace(num_splits=None)
    return None


def measured_ms(key: str, packaged: bool = False) -> float | None:
    """The median the stored config of `key` measured (the user's file; packaged=True: or the package's)."""
    return (_entry(key, packaged) or {}).get("ms")


def record(key: str, config, ms: float | None, save: bool = True) -> None:
    """Store `config` (typed) with its median for `key`; save: write the JSON file now."""
    _load()[key] = {**config.to_dict(), "ms": ms}
    _PARSED.clear()  # a new bucket can change what `nearest` answers for its neighbours
    _PARSED[key, True] = _PARSED[key, False] = config
    if save:
        _dump(cache_path())


def export_configs(path: str) -> str:
    """Write every stored config (with the GPU name) to `path` as JSON; returns path."""
    _dump(path)
    return path
