"""Round-trip error of a spec or scheme on synthetic (or captured) data: quantize -> dequantize."""
from __future__ import annotations

import torch

from ..quant import dequantize, quantize
from ..spec import KVQuantSpec, KVScheme, as_scheme
from .distributions import sample
from .metrics import all_metrics


def roundtrip(x: torch.Tensor, spec: KVQuantSpec) -> dict:
    """Metrics of dequantize(quantize(x, spec)) against x [..., T, D], plus stored bits/element."""
    y = dequantize(quantize(x, spec))
    return {**all_metrics(x.float(), y.float()), "bits_per_element": spec.bits_per_element_at(x.shape[-1])}


def roundtrip_scheme(s, dist: str = "student_t4", n: int = 4096, d: int = 128, seed: int = 0,
                     device="cpu") -> dict:
    """Round-trip metrics of a scheme's K and V specs on one synthetic distribution.

    Returns {k_rel_l1, v_rel_l1, rel_l1 (mean of K and V), k_sqnr_db, ...}. n must be a multiple of
    the chan group (it is rounded down)."""
    s: KVScheme = as_scheme(s)
    x = sample(dist, n, d, seed, device)
    out = {}
    for name, spec in (("k", s.k), ("v", s.v)):
        xx = x[: n - n % spec.group] if spec.axis == "chan" else x
        for key, val in roundtrip(xx, spec).items():
            out[f"{name}_{key}"] = val
    for key in ("rel_l1", "rel_l2", "sqnr_db", "max_abs"):
        out[key] = (out[f"k_{key}"] + out[f"v_{key}"]) / 2
    out["bits_per_element"] = s.bits_per_element(d)
    return out
