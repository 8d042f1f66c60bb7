"""`grid(...)`: expand brace expressions or a mapping of options into a list of schemes.

    grid("int{2,3,4,8}:g{32,64}:{sym,asym}")          -> 16 schemes (cartesian product)
    grid("int{2..8}:g32")                               -> int2 .. int8
    grid({"k": "int{2,4}:g32:chan:asym", "v": ["int4:g32", "q8_0"], "window": [0, 128]})
"""
from __future__ import annotations

import itertools
import re

from .scheme import KVScheme, parse_scheme

_BRACE = re.compile(r"\{([^{}]*)\}")


def expand(text: str) -> list[str]:
    """Brace-expand `text` (no nesting): `{a,b}` lists, `{2..8}` integer ranges."""
    if text.count("{") != text.count("}"):
        raise ValueError(f"unbalanced braces in {text!r}")
    parts = _BRACE.split(text)
    choices = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            choices.append([part])
            continue
        m = re.fullmatch(r"(-?\d+)\.\.(-?\d+)", part)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            choices.append([str(x) for x in range(lo, hi + 1)] if lo <= hi else [])
        else:
            choices.append(part.split(","))
        if not choices[-1] or "" in choices[-1] and len(choices[-1]) == 1:
            raise ValueError(f"empty brace group {{{part}}} in {text!r}")
    if any("{" in c or "}" in c for c in parts[::2]):
        raise ValueError(f"nested braces are not supported in {text!r}")
    return ["".join(p) for p in itertools.product(*choices)]


def _options(value) -> list[str]:
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _options(v)]
    return expand(str(value))


def grid(spec) -> list[KVScheme]:
    """Expand a brace expression, a list of expressions, or a mapping into unique schemes (in order).

    Mapping keys: `scheme` (whole scheme texts), `k`, `v`, `kv` (same spec for both), `window`,
    `sink`; each value is a string (brace-expanded) or a list.
    """
    if isinstance(spec, str):
        texts = expand(spec)
    elif isinstance(spec, (list, tuple)):
        texts = [t for s in spec for t in _options(s)]
    elif isinstance(spec, dict):
        allowed = {"scheme", "k", "v", "kv", "window", "sink"}
        bad = set(spec) - allowed
        if bad:
            raise ValueError(f"unknown grid keys {sorted(bad)}; allowed: {sorted(allowed)}")
        base = []
        if "scheme" in spec:
            base = _options(spec["scheme"])
        if "kv" in spec:
            base += _options(spec["kv"])
        if "k" in spec or "v" in spec:
            if "k" not in spec or "v" not in spec:
                raise ValueError("a grid mapping with 'k' needs 'v' too (or use 'kv')")
            base += [f"k={k},v={v}" for k in _options(spec["k"]) for v in _options(spec["v"])]
        if not base:
            raise ValueError("a grid mapping needs 'scheme', 'kv' or 'k' and 'v'")
        extras = [[f"{key}={w}" for w in _options(spec[key])] for key in ("window", "sink") if key in spec]
        texts = [",".join((b, *e)) for b in base for e in itertools.product(*extras)]
    else:
        raise ValueError(f"grid takes a string, a list or a mapping, not {type(spec).__name__}")
    return unique(parse_scheme(t) for t in texts)


def unique(schemes) -> list:
    """The schemes in first-seen order, each once (schemes are equal when their specs and options are)."""
    return list(dict.fromkeys(schemes))
