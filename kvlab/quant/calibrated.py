"""Calibrated codebooks (`lm2..lm4:cal`, `int2..int4:cal`): per-layer level tables fitted to calibration data.

A Lloyd-Max format stores each group as codes into 2^bits levels in units of the group's RMS. Its fixed levels are
the optimum for Gaussian coordinates (what a random rotation makes of most data); `cal` replaces them with levels
fitted to a layer's own keys or values, as KVQuant's non-uniform datatype: a weighted k-means (Lloyd's algorithm)
over the calibration values divided by their group's stored RMS scale, each value weighted by the square of that
scale (so the fit minimises the absolute squared error the cache makes) times an optional per-element weight (for
keys: the mean square of the matching query channel, so errors where queries are large cost more). Started from the
Lloyd-Max levels, deterministic, on any device.

A calibrated int keeps its scale and zero point (min-max for asym: the group's range in 2^b - 1 steps) and fits
its 2^b levels in those code units, (x - zero) / scale, started from the integers, its two end levels kept (the
group's min and max stay exact). Free ends cut SmolLM2's key score error most (-36% at 2 bits) but raised the
model's KL at every width, since the extremes they clip are the keys attention picks; with the ends kept, KL falls
at 2 bits (KIVI keys and values: 0.318 -> 0.292) and is unchanged at 3 and 4 (sweeps/results/quality/cal_ints/).
"""
from __future__ import annotations

import torch

from ..spec import KVQuantSpec, as_spec
from .formats import codebook, scale_value, store_scale, uniform_levels
from .oracle import _quant_int, _reduce, check_input, group
from .rotation import rotate

MAX_SAMPLES = 1 << 20  # values a fit uses (an even stride over larger samples)


def lloyd_levels(u: torch.Tensor, w: torch.Tensor, start: torch.Tensor, iters: int = 40,
                 keep_ends: bool = False) -> torch.Tensor:
    """Lloyd's algorithm for ascending levels [n] over values u [N] with weights w [N] (a weighted 1-D k-means):
    each value to its nearest level (the first on ties), each level to its values' weighted mean (an empty level
    stays), until nothing moves or `iters` steps; keep_ends holds the first and last level of `start` in place (the
    others stay between them). Never raises the weighted squared error of `start`. The step `fit_codebook` runs
    after turning a sample into units and weights."""
    levels, n = start, start.numel()
    ends = start[[0, -1]].clone() if keep_ends else None
    for _ in range(iters):
        idx = (u[:, None] - levels[None]).abs().argmin(-1)
        num = torch.zeros(n, device=u.device).index_add_(0, idx, u * w)
        den = torch.zeros(n, device=u.device).index_add_(0, idx, w)
        new = torch.where(den > 0, num / den.clamp_min(1e-30), levels).sort().values
        if ends is not None:
            new = torch.cat([ends[:1], new[1:-1].clamp(float(ends[0]), float(ends[1])), ends[1:]])
        if torch.equal(new, levels):
            break
        levels = new
    return levels


def fit_codebook(x: torch.Tensor, spec, weights: torch.Tensor | None = None, iters: int = 40) -> torch.Tensor:
    """Levels float32 [2^bits], strictly ascending, for a calibrated spec from sample tokens x [..., T, D].

    weights: None, or non-negative weights broadcastable to x, in the spec's rotated domain when it rotates (for
    keys, E[(H q)_c^2] per channel c). Values whose group is all zero or not finite are left out. ValueError for a
    spec that is not `cal`, an input the spec cannot group, or a sample with no usable value."""
    spec = as_spec(spec)
    if not isinstance(spec, KVQuantSpec) or not spec.calibrated:
        raise ValueError(f"fit_codebook fits a calibrated spec (lm2..lm4 or int2..int4 with ':cal'), got {spec}")
    check_input(x, spec)
    xf = x.float()
    if spec.rotation == "had":
        xf = rotate(xf)
    xg = group(xf, spec)                                            # [..., A, B, G]
    if spec.fmt == "int":  # code units: (x - zero) / scale, by the stored scale and zero
        _, s_st, m_st = _quant_int(xg, spec, 1.0)
        r = scale_value(s_st, spec.scale_dtype)
        if m_st is not None:
            xg = xg - scale_value(m_st, spec.scale_dtype)
    else:
        r = scale_value(store_scale(_reduce(xg, "rms", spec), spec.scale_dtype), spec.scale_dtype)  # as stored
    w = r.pow(2).expand(xg.shape)
    if weights is not None:
        wt = torch.as_tensor(weights, dtype=torch.float32, device=x.device)
        if bool((wt < 0).any()) or not bool(torch.isfinite(wt).all()):
            raise ValueError("weights must be finite and non-negative")
        w = w * group(wt.expand(xf.shape).contiguous(), spec)
    ok = torch.isfinite(r) & (r != 0)  # (a symmetric int's signed rule gives negative scales)
    u = (xg / torch.where(ok, r, torch.ones_like(r)))[ok.expand(xg.shape)]
    w = w[ok.expand(xg.shape)]
    if u.numel() == 0 or float(w.sum()) <= 0:
        raise ValueError("no usable calibration values (every group is zero or not finite, or weights are all zero)")
    if u.numel() > MAX_SAMPLES:
        step = -(-u.numel() // MAX_SAMPLES)
        u, w = u[::step], w[::step]
    start = uniform_levels(spec, x.device) if spec.fmt == "int" else codebook(spec.fmt, x.device)
    levels = lloyd_levels(u, w, start, iters, keep_ends=spec.fmt == "int")  # an int's ends: its min and max
    n = levels.numel()
    gap = torch.diff(levels)
    if n > 1 and not bool((gap > 0).all()):  # collapsed levels (a degenerate sample): keep them distinct
        eps = 1e-4 * float(levels.abs().max().clamp_min(1.0))
        levels = levels + eps * torch.arange(n, dtype=torch.float32, device=x.device)
    return levels.float()
