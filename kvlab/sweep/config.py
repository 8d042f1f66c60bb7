"""Sweep files: YAML -> a validated `SweepConfig`.

    name: default                 # results go to sweeps/results/<name>/
    seed: 0
    schemes:                      # DSL grid expressions, preset names, `presets` (= all presets),
      - presets                   #   or mappings as kvlab.grid takes them
      - "int{2,3,4,8}:g{32,128}:{sym,asym}"
    stages:
      roundtrip: {distributions: [student_t4, outlier_channels, real], tokens: 4096, head_dim: 128}
      attention: {tokens: 512}
      model:     {tokens: 512, segments: 2, text: pydoc, greedy: 0, passkey: []}
      speed:     {shapes: [{batch: 32, context: 32768, heads_q: 32, heads_kv: 8, head_dim: 128, page_size: 16}],
                  ops: [decode, store], tune: quick}   # tune: quick (2-4 configs) | full (the whole space)
    model: smollm2                # for the real-K/V, attention and model stages
    device: auto                  # auto | cpu | cuda
    gpu_overrides: {...}          # optional: keys replacing stage settings when running on a GPU

Every key is checked: an unknown key or a bad value raises `ValueError` naming the key path and
what is allowed.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import yaml

from ..spec import ALL_PRESETS, KVScheme, grid
from ..spec.grid import unique

STAGES = ("roundtrip", "attention", "model", "speed")
STAGE_KEYS = {
    "roundtrip": {"distributions": list, "tokens": int, "head_dim": int},
    "attention": {"tokens": int, "text": str},
    "model": {"tokens": int, "segments": int, "text": str, "greedy": int, "passkey": list},
    "speed": {"shapes": list, "ops": list, "tune": str},
}
STAGE_DEFAULTS = {
    "roundtrip": {"distributions": ["student_t4", "outlier_channels", "real"], "tokens": 4096, "head_dim": 128},
    "attention": {"tokens": 512, "text": "pydoc"},
    "model": {"tokens": 512, "segments": 2, "text": "pydoc", "greedy": 0, "passkey": []},
    "speed": {"shapes": [{"batch": 32, "context": 32768, "heads_q": 32, "heads_kv": 8, "head_dim": 128,
                          "page_size": 16}], "ops": ["decode", "store"], "tune": "quick"},
}
SHAPE_KEYS = {"batch", "context", "heads_q", "heads_kv", "head_dim", "page_size"}
TOP_KEYS = {"name", "seed", "schemes", "stages", "model", "device", "gpu_overrides", "description"}


@dataclass
class SweepConfig:
    name: str
    schemes: list[KVScheme]
    stages: dict[str, dict]
    seed: int = 0
    model: str = "smollm2"
    device: str = "auto"
    gpu_overrides: dict = field(default_factory=dict)
    description: str = ""
    source: dict = field(default_factory=dict)

    def for_device(self, device: str) -> "SweepConfig":
        """A copy with `gpu_overrides` applied when device is cuda (stages and schemes may grow)."""
        if device != "cuda" or not self.gpu_overrides:
            return self
        raw = copy.deepcopy(self.source)
        over = raw.pop("gpu_overrides")
        for key, val in over.items():
            if key == "stages":
                for st, params in val.items():
                    raw.setdefault("stages", {})[st] = {**(raw.get("stages", {}).get(st) or {}), **(params or {})}
            else:
                raw[key] = val
        return parse_config(raw)


def _err(path: str, msg: str) -> ValueError:
    return ValueError(f"sweep config: {path}: {msg}")


def _schemes(items) -> list[KVScheme]:
    if not isinstance(items, list) or not items:
        raise _err("schemes", "must be a non-empty list of DSL expressions, preset names, 'presets' or mappings")
    out = []
    for i, item in enumerate(items):
        try:
            out += grid(list(ALL_PRESETS) if item == "presets" else item)
        except ValueError as e:
            raise _err(f"schemes[{i}] ({item!r})", str(e)) from None
    return unique(out)


def _stage(name: str, params) -> dict:
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise _err(f"stages.{name}", "must be a mapping of settings (or empty)")
    allowed = STAGE_KEYS[name]
    for key, val in params.items():
        if key not in allowed:
            raise _err(f"stages.{name}.{key}", f"unknown key; allowed: {', '.join(allowed)}")
        if not isinstance(val, allowed[key]) or isinstance(val, bool) and allowed[key] is int:
            raise _err(f"stages.{name}.{key}", f"must be {allowed[key].__name__}, got {val!r}")
    out = {**STAGE_DEFAULTS[name], **params}
    if name == "speed":
        if out["tune"] not in ("quick", "full"):
            raise _err("stages.speed.tune", f"unknown {out['tune']!r}; allowed: quick (two tiles, then splits), full")
        for j, shp in enumerate(out["shapes"]):
            if not isinstance(shp, dict) or set(shp) != SHAPE_KEYS:
                raise _err(f"stages.speed.shapes[{j}]", f"needs exactly the keys {sorted(SHAPE_KEYS)}")
    if name == "roundtrip":
        from ..eval.distributions import DISTRIBUTIONS
        for d in out["distributions"]:
            if d not in (*DISTRIBUTIONS, "real"):
                raise _err("stages.roundtrip.distributions", f"unknown {d!r}; allowed: {', '.join(DISTRIBUTIONS)}, real")
    for key in ("tokens", "segments"):
        if key in out and out[key] < 1:
            raise _err(f"stages.{name}.{key}", "must be >= 1")
    return out


def parse_config(raw: dict) -> SweepConfig:
    """Validate a sweep mapping (as loaded from YAML)."""
    if not isinstance(raw, dict):
        raise _err("<top>", "a sweep file must be a YAML mapping")
    unknown = set(raw) - TOP_KEYS
    if unknown:
        raise _err(sorted(unknown)[0], f"unknown key; allowed: {', '.join(sorted(TOP_KEYS))}")
    if "name" not in raw or not isinstance(raw["name"], str) or not raw["name"].replace("-", "").replace("_", "").isalnum():
        raise _err("name", "required: letters, digits, '-' and '_' (it names the results folder)")
    stages = raw.get("stages")
    if not isinstance(stages, dict) or not stages:
        raise _err("stages", f"required: a mapping with one or more of {', '.join(STAGES)}")
    for st in stages:
        if st not in STAGES:
            raise _err(f"stages.{st}", f"unknown stage; allowed: {', '.join(STAGES)}")
    device = raw.get("device", "auto")
    if device not in ("auto", "cpu", "cuda"):
        raise _err("device", "allowed: auto, cpu, cuda")
    seed = raw.get("seed", 0)
    if not isinstance(seed, int):
        raise _err("seed", f"must be an int, got {seed!r}")
    over = raw.get("gpu_overrides") or {}
    if not isinstance(over, dict) or set(over) - {"stages", "schemes"}:
        raise _err("gpu_overrides", "a mapping with 'stages' and/or 'schemes'")
    return SweepConfig(name=raw["name"], schemes=_schemes(raw.get("schemes")),
                       stages={st: _stage(st, stages[st]) for st in STAGES if st in stages}, seed=seed,
                       model=str(raw.get("model", "smollm2")), device=device, gpu_overrides=over,
                       description=str(raw.get("description", "")), source=copy.deepcopy(raw))


def load_config(path: str) -> SweepConfig:
    """Read and validate a YAML sweep file."""
    try:
        with open(path) as f:
            raw = yaml.safe_load(f)
    except FileNotFoundError:
        raise ValueError(f"sweep config {path!r} does not exist") from None
    except yaml.YAMLError as e:
        raise ValueError(f"sweep config {path!r} is not valid YAML: {e}") from None
    return parse_config(raw)
