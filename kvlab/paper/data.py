"""Result files the paper needs that are cheap to recompute on a CPU (`python -m kvlab.paper --refresh-data`):
round trips on FreeToken's own test distribution, written beside the other CPU results."""
from __future__ import annotations

import csv
from pathlib import Path

FREETOKEN = "sweeps/results/cpu/freetoken_roundtrip.csv"


def freetoken_roundtrip(root: Path) -> Path:
    """Round-trip rel-L1 of FreeToken's formats on its test distribution (4,096 x 128, seed 0)."""
    import kvlab
    from kvlab.eval import rel_l1, sample
    x = sample("freetoken", 4096, 128, 0)
    out = root / FREETOKEN
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["scheme", "spec", "bits_per_element", "rel_l1", "dist", "n", "d", "seed",
                    "command"])
        for name in ("freetoken:q4_0", "freetoken:q6_0", "freetoken:q8_0", "freetoken:fp8_e4m3"):
            spec = kvlab.scheme(name).k
            y = kvlab.dequantize(kvlab.quantize(x, spec))
            w.writerow([name, str(spec), spec.bits_per_element, rel_l1(x, y), "freetoken", 4096, 128, 0,
                        "python -m kvlab.paper --refresh-data"])
    return out
