"""Torch placement of oracle output into pages, and back (the reference side of the store).

`write_tokens` is the reference store: `kvlab.quantize` of the new tokens, then each row /
channel group placed at its slot (`slot = page * P + offset`), exactly as `PageLayout`
describes. `read_qtensor` gathers a sequence's pages back into the oracle's `QTensor` shapes,
so `kvlab.dequantize` gives the cached values (the reference attention kernels are tested
against). Slot -1 means "skip this token" (padding), as in vLLM's slot mapping.
"""
from __future__ import annotations

import dataclasses

import torch

from ..quant import QTensor, quantize
from ..quant.formats import FLOAT_STORAGE, store_scale
from ..quant.rotation import rotate
from ..quant.smoothing import unsmoothed
from .layout import PageLayout


def _as_static(v, device) -> torch.Tensor | None:
    """A static scale (float, 0-d or 1-element tensor) as a float32 0-d tensor."""
    if v is None:
        return None
    return torch.as_tensor(v, dtype=torch.float32, device=device).reshape(())


def prerotate(x: torch.Tensor, spec):
    """(x, spec) -> (x @ H in float32, spec without rotation) for rotated specs; else unchanged.

    The store rotates the [T, Hk, D] tokens once with torch, so the Triton and the torch paths
    quantize the very same float32 values."""
    if spec.rotation == "had":
        return rotate(x), dataclasses.replace(spec, rotation="none")
    return x, spec


def write_tokens(x: torch.Tensor, pages: dict, slots: torch.Tensor, spec, page_size: int, *,
                 scale=None, tensor_scale=None) -> None:
    """Quantize x [T, Hk, D] with the oracle and write it into `pages` at `slots` [T] (int).

    Axis chan: T is a multiple of the group G and each run of G tokens has consecutive slots
    starting at a multiple of G (one channel group of a page). `scale` is the static scale of an
    axis-tensor spec, `tensor_scale` NVFP4's fp32 second level (both float32, set by the pool).
    """
    T, Hk, D = x.shape
    spec = unsmoothed(spec)  # a smoothed / permuted spec's pages hold keys already divided and permuted
    x, spec = prerotate(x, spec)
    lay = PageLayout(spec, D, page_size, Hk)
    P, G = page_size, lay.group
    slots = slots.to(device=x.device, dtype=torch.int64)
    kw = {"scale": _as_static(scale, x.device)} if spec.static_scale else {}
    if spec.tensor_scale:
        kw["tensor_scale"] = _as_static(tensor_scale, x.device)
    if spec.calibrated:
        kw["codebook"] = pages["codebook"]
    if spec.axis == "chan":
        q = quantize(x.transpose(0, 1), spec, **kw)  # codes [Hk, T/G, D, GB], scales [Hk, T/G, D]
        first = slots[::G]  # [T/G]
        keep = first >= 0
        page, blk = first[keep] // P, (first[keep] % P) // G
        pages["codes"][page, :, blk] = q.codes.transpose(0, 1)[keep]
        for key, t in (("scales", q.scales), ("zeros", q.zeros)):
            if t is not None:
                pages[key][page, :, blk] = t.transpose(0, 1)[keep]
        if spec.outliers:  # slots are per token: [Hk, T, N] -> each token's slot
            _write_slots(pages, q.out_idx.transpose(0, 1), q.out_val.transpose(0, 1), slots, P)
        return
    keep = slots >= 0
    page, off = slots[keep] // P, slots[keep] % P
    if spec.is_float_storage:
        pages["codes"][page, :, off] = x[keep].to(FLOAT_STORAGE[spec.fmt])
        return
    q = quantize(x[keep], spec, **kw)  # codes [T', Hk, D/G, GB], scales [T', Hk, D/G]
    pages["codes"][page, :, off] = q.codes.flatten(2)  # [T', Hk, D/G * GB]
    if lay.has_group_scales:
        pages["scales"][page, :, off] = q.scales
        if q.zeros is not None:
            pages["zeros"][page, :, off] = q.zeros
    if spec.outliers:
        _write_slots(pages, q.out_idx, q.out_val, slots[keep], P)


def _write_slots(pages: dict, idx: torch.Tensor, val: torch.Tensor, slots: torch.Tensor, P: int) -> None:
    """Outlier slots idx / val [T, Hk, N] of tokens at `slots` [T] (-1: skipped) into pages["out_idx"/"out_val"]."""
    keep = slots >= 0
    page, off = slots[keep] // P, slots[keep] % P
    pages["out_idx"][page, :, off] = idx[keep]
    pages["out_val"][page, :, off] = val[keep]


def read_qtensor(pages: dict, spec, page_ids, n_tokens: int, head_dim: int, *, scale=None,
                 tensor_scale=None) -> QTensor:
    """The first `n_tokens` tokens held by pages `page_ids` (in order) as the oracle's QTensor of
    a [Hk, n_tokens, D] float32 tensor. Not for bf16/fp16 specs (use `read_values`). A smoothed spec's tokens are
    read as stored (divided by pages["smooth"]; the QTensor's spec drops `smooth`)."""
    spec = unsmoothed(spec)
    codes = pages["codes"]
    P = codes.shape[2] * (spec.group if spec.axis == "chan" else 1)
    Hk = codes.shape[1]
    idx = torch.as_tensor(list(page_ids), dtype=torch.int64, device=codes.device)
    lay = PageLayout(spec, head_dim, P, Hk)

    def take(t, n):  # [np, Hk, A, ...] -> [Hk, np * A, ...][:, :n]
        t = t[idx].transpose(0, 1)
        return t.reshape(Hk, -1, *t.shape[3:])[:, :n]

    G = lay.group
    if spec.axis == "chan":
        n = n_tokens // G
        c = take(codes, n)  # [Hk, n/G, D, GB]
    else:
        n = n_tokens
        c = take(codes, n).reshape(Hk, n, head_dim // G, -1)  # [Hk, n, D/G, GB]
    s = z = None
    if lay.has_group_scales:
        s = take(pages["scales"], n)
        z = take(pages["zeros"], n) if pages.get("zeros") is not None else None
    elif spec.static_scale:
        s = store_scale(_as_static(scale, codes.device), spec.scale_dtype, elem_fmt=spec.fmt)
    ts = _as_static(tensor_scale, codes.device) if spec.tensor_scale else None
    cb = pages["codebook"][:2 ** spec.bits] if spec.calibrated else None
    oi = ov = None
    if spec.outliers:
        oi, ov = take(pages["out_idx"], n_tokens), take(pages["out_val"], n_tokens)  # [Hk, n_tokens, N]
    return QTensor(c, s, z, ts, spec, (Hk, n_tokens, head_dim), torch.float32, cb, out_idx=oi, out_val=ov)


def read_values(pages: dict, spec, page_ids, n_tokens: int, head_dim: int, *, scale=None,
                tensor_scale=None) -> torch.Tensor:
    """Dequantized float32 [Hk, n_tokens, D] of the first `n_tokens` tokens in pages `page_ids`."""
    from ..quant import dequantize
    codes = pages["codes"]
    if n_tokens == 0:
        return torch.zeros(codes.shape[1], 0, head_dim, dtype=torch.float32, device=codes.device)
    if spec.is_float_storage:
        idx = torch.as_tensor(list(page_ids), dtype=torch.int64, device=codes.device)
        t = codes[idx].transpose(0, 1)  # [Hk, np, P, D]
        return t.reshape(t.shape[0], -1, head_dim)[:, :n_tokens].float()
    q = read_qtensor(pages, spec, page_ids, n_tokens, head_dim, scale=scale, tensor_scale=tensor_scale)
    return dequantize(q)


def codebook_table(levels: torch.Tensor) -> torch.Tensor:
    """A calibrated codebook's levels [2^bits] as the pages hold them: float32 [16], padded with the last level
    (a nearest-level search that keeps the first index on ties never picks a pad)."""
    t = levels.float().reshape(-1)
    return torch.cat([t, t[-1:].expand(16 - t.numel())]) if t.numel() < 16 else t


def calibrate(x: torch.Tensor, spec) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Static scales of `spec` from sample tokens x [..., D] -> (scale, tensor_scale), float32 0-d
    tensors or None when the spec keeps none.

    scale (axis tensor): as the oracle computes it over x (rotated first if the spec rotates):
    absmax / qmax (int), signed extreme / -2^(b-1) (int, rule signed), absmax / 2^(b-1) (rule full), absmax / fp8 max or
    / 2^emax (e8m0). tensor_scale (NVFP4): absmax / (6 * 448). Only finite values count; an
    all-zero (or all non-finite) sample gives 1.0 instead of a scale that would zero every code.
    """
    from ..quant.formats import CODEBOOKS, ELEM_EMAX, FP8_MAX, codebook_absmax
    if not spec.needs_tensor_scale:
        return None, None
    xf = rotate(x) if spec.rotation == "had" else x.float()
    xf = torch.where(torch.isfinite(xf), xf, torch.zeros_like(xf)).reshape(-1)
    amax = xf.abs().amax() if xf.numel() else torch.zeros((), device=x.device)
    one = torch.ones((), dtype=torch.float32, device=x.device)
    scale = ts = None
    if spec.static_scale:
        if spec.fmt == "int":
            b = spec.bits
            if spec.rule == "signed":
                s = xf[xf.abs().argmax()] / -(2 ** (b - 1)) if xf.numel() else amax
            elif spec.rule == "full":
                s = amax / 2 ** (b - 1)
            else:
                s = amax / (2 ** (b - 1) - 1)
        elif spec.scale_dtype == "e8m0":
            s = amax / 2 ** ELEM_EMAX[spec.fmt]
        else:
            s = amax / FP8_MAX[spec.fmt]
        scale = torch.where(s != 0, s, one).float().reshape(())
    if spec.tensor_scale:
        t = amax / (codebook_absmax(spec.fmt) * 448.0) if spec.fmt in CODEBOOKS else amax
        ts = torch.where(t > 0, t, one).float().reshape(())
    return scale, ts
