"""Round-trip error of a spec or scheme on synthetic (or captured) data: quantize -> dequantize."""
from __future__ import annotations

import torch

from ..quant import dequantize, fit_codebook, quantize
from ..spec import KVQuantSpec, KVScheme, as_scheme
from .distributions import sample
from .metrics import all_metrics


def roundtrip(x: torch.Tensor, spec: KVQuantSpec, calib_x: torch.Tensor | None = None) -> dict:
    """Metrics of dequantize(quantize(x, spec)) against x [..., T, D], plus stored bits/element. A calibrated spec
    (`cal`) fits its levels on `calib_x` (other data of the same kind; required for it). Key smoothing (`smooth`)
    balances keys against queries, which a round trip has none of: it is measured without (factors 1)."""
    from ..quant.smoothing import unsmoothed
    spec = unsmoothed(spec)
    cb = None
    if spec.calibrated:
        if calib_x is None:
            raise ValueError(f"spec {spec} is calibrated: give calib_x, other data to fit its levels on")
        cb = fit_codebook(calib_x, spec)
    y = dequantize(quantize(x, spec, codebook=cb))
    return {**all_metrics(x.float(), y.float()), "bits_per_element": spec.bits_per_element_at(x.shape[-1])}


def roundtrip_scheme(s, dist: str = "student_t4", n: int = 4096, d: int = 128, seed: int = 0,
                     device="cpu") -> dict:
    """Round-trip metrics of a scheme's K and V specs on one synthetic distribution.

    Returns {k_rel_l1, v_rel_l1, rel_l1 (mean of K and V), k_sqnr_db, ...}. n must be a multiple of
    the chan group (it is rounded down). A calibrated spec fits its levels on another sample (seed + 1)."""
    s: KVScheme = as_scheme(s)
    x = sample(dist, n, d, seed, device)
    other = sample(dist, n, d, seed + 1, device) if (s.k.calibrated or s.v.calibrated) else None  # calibration
    out = {}
    for name, spec in (("k", s.k), ("v", s.v)):
        cut = (lambda t: t[: n - n % spec.group]) if spec.axis == "chan" else (lambda t: t)  # noqa: E731
        for key, val in roundtrip(cut(x), spec, None if other is None else cut(other)).items():
            out[f"{name}_{key}"] = val
    for key in ("rel_l1", "rel_l2", "sqnr_db", "max_abs"):
        out[key] = (out[f"k_{key}"] + out[f"v_{key}"]) / 2
    out["bits_per_element"] = s.bits_per_element(d)
    return out
