"""Tuned kernel configs for one scheme, copied from the per-GPU tuned-config store (kvlab.kernels.tuned).

Attention keys are `op|k=<K spec>|v=<V spec>|B<bucket>|Hq|Hk|D|P<page>` and store keys
`store|<spec>|Hk|D`; the entries for the scheme's K and V specs are exported with the GPU name they
were tuned on.
"""
from __future__ import annotations

import json
import os

from ..spec import KVScheme

FILENAME = "tuned_configs.json"


def configs_for(sch: KVScheme, path: str | None = None) -> dict:
    """{"gpu", "source", "configs": {key: config}} for `sch` from the tuning cache (empty configs if none)."""
    from ..kernels.tuned import cache_path
    src = path or cache_path()
    try:
        with open(src) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {"gpu": None, "source": src, "configs": {}}
    want = (f"k={sch.k}", f"v={sch.v}")
    specs = {str(sch.k), str(sch.v)}
    picked = {key: cfg for key, cfg in (data.get("configs") or {}).items()
              if tuple(key.split("|")[1:3]) == want or (key.startswith("store|") and key.split("|")[1] in specs)}
    return {"gpu": data.get("gpu"), "source": src, "configs": picked}


def write_tuned(sch: KVScheme, out_dir: str, path: str | None = None) -> str | None:
    """Write tuned_configs.json when the cache knows this scheme; returns the file name or None."""
    found = configs_for(sch, path)
    if not found["configs"]:
        return None
    with open(os.path.join(out_dir, FILENAME), "w") as f:
        json.dump({"scheme": str(sch), **found}, f, indent=1, sort_keys=True)
        f.write("\n")
    return FILENAME
