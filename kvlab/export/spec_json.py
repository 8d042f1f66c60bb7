"""`scheme.json`: a scheme as versioned JSON that `kvlab.scheme("DIR/scheme.json")` reads back.

The file is `KVScheme.to_dict()` (version, canonical text, K/V spec dicts, window, sink,
per-layer overrides) plus provenance that `KVScheme.from_dict` ignores: the kvlab version and
the stored bits per element (payload + scales + zero points) at the head_dim exported for.
"""
from __future__ import annotations

import json
import os

from ..spec import KVScheme, as_scheme

FILENAME = "scheme.json"


def scheme_dict(sch, head_dim: int = 128) -> dict:
    """`KVScheme.to_dict()` plus kvlab version and bits/element (total, K, V) at `head_dim`."""
    from .. import __version__
    s: KVScheme = as_scheme(sch)
    return {**s.to_dict(), "kvlab_version": __version__, "head_dim": head_dim,
            "bits_per_element": s.bits_per_element(head_dim),
            "k_bits_per_element": s.k.bits_per_element_at(head_dim),
            "v_bits_per_element": s.v.bits_per_element_at(head_dim)}


def write_scheme_json(sch, out_dir: str, head_dim: int = 128) -> str:
    """Write `out_dir/scheme.json`; returns its path. Checks that it reads back equal."""
    d = scheme_dict(sch, head_dim)
    path = os.path.join(out_dir, FILENAME)
    with open(path, "w") as f:
        json.dump(d, f, indent=1)
        f.write("\n")
    back = read_scheme_json(path)
    if back != as_scheme(sch):  # a spec field that does not survive JSON is a bug, not a user error
        raise RuntimeError(f"scheme.json does not read back equal: wrote {as_scheme(sch)}, read {back}")
    return path


def read_scheme_json(path: str) -> KVScheme:
    """The `KVScheme` stored in a scheme.json (a file path or the directory holding it)."""
    if os.path.isdir(path):
        path = os.path.join(path, FILENAME)
    return as_scheme(path)
