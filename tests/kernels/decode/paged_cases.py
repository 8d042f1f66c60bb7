"""Build paged quantized caches from the oracle for kernel tests (pages in random physical order).

Slots past a sequence's end (and unused full-precision rows) are poisoned with NaN scales /
values, so a kernel that reads beyond a sequence shows NaN.
"""
from __future__ import annotations

import math

import torch

import kvlab
from kvlab.cache.layout import PageLayout
from kvlab.cache.paging import codebook_table
from kvlab.quant import fit_codebook
from kvlab.quant.smoothing import unsmoothed
from kvlab.spec import KVQuantSpec

NAN_BYTES = {torch.uint8: 255, torch.float8_e4m3fn: float("nan")}


def _poison(t: torch.Tensor) -> None:
    t.fill_(NAN_BYTES.get(t.dtype, float("nan")))


def calibrated_levels(spec: KVQuantSpec, D: int, seed: int = 0) -> torch.Tensor:
    """Levels of a calibrated spec fitted to heavy-tailed sample data (cubed normals): far from the Lloyd-Max
    ones, so a kernel that read the format's fixed table instead of the pages' would fail."""
    g = torch.Generator().manual_seed(seed + 7)
    x = torch.randn(2, 4 * max(spec.group, 16), D, generator=g) ** 3
    return fit_codebook(x, spec)


def make_paged(lens, Hk, D, P, k_spec: KVQuantSpec, v_spec: KVQuantSpec, *, fp_lens=None, fp_width=0, seed=0,
               device="cpu", extra_pages=3):
    """-> dict(k_pages, v_pages, kv_indptr, kv_indices, kv_last_page_len, k_fp, v_fp, fp_len, k_ts, v_ts)."""
    g = torch.Generator().manual_seed(seed)
    npages = [math.ceil(L / P) for L in lens]
    total = sum(npages) + extra_pages
    phys = torch.randperm(total, generator=g)
    indptr = torch.tensor([0] + list(torch.tensor(npages).cumsum(0).tolist()), dtype=torch.int32)
    indices = phys[:sum(npages)].to(torch.int32)
    last = torch.tensor([L - (n - 1) * P if n else 0 for L, n in zip(lens, npages)], dtype=torch.int32)
    out = dict(kv_indptr=indptr, kv_indices=indices, kv_last_page_len=last)
    for name, spec in (("k", k_spec), ("v", v_spec)):
        lay = PageLayout(spec, D, P, Hk)
        pages = lay.allocate(total)
        for key, t in pages.items():
            if t is not None and key != "perm":  # (an order is set below; there is no poison for an index)
                _poison(t) if t.dtype != torch.uint8 or t is not pages["codes"] else t.random_(0, 256, generator=g)
        xs = [torch.randn(Hk, n * P, D, generator=g) * (1 + torch.rand(1, 1, D, generator=g) * 3) for n in npages]
        cb = calibrated_levels(spec, D, seed) if spec.calibrated else None
        qspec = unsmoothed(spec)
        if spec.smooth:  # smoothed keys: factors in [1/2, 2] beside the pages, which hold the stored keys (x as drawn)
            pages["smooth"].copy_(torch.exp2(torch.rand(Hk, D, generator=g) * 2 - 1))
        if spec.permute:  # permuted keys: a channel order per head beside the pages, which hold the stored keys
            pages["perm"].copy_(torch.stack([torch.randperm(D, generator=g) for _ in range(Hk)]))
        if cb is not None:  # a calibrated codebook: its table beside the pages (poisoned with NaN above)
            pages["codebook"].copy_(codebook_table(cb))
        ts = None
        if spec.tensor_scale:
            ts = torch.stack([x.abs().amax() for x in xs if x.numel()]).amax() / (6 * 448)
        for b, (x, n) in enumerate(zip(xs, npages)):
            if n == 0:
                continue
            ids = indices[indptr[b]:indptr[b + 1]].long()
            qt = kvlab.quantize(x, qspec, tensor_scale=ts, codebook=cb)
            if spec.is_float_storage:
                pages["codes"][ids] = x.to(lay.code_dtype).reshape(Hk, n, P, D).transpose(0, 1)
            else:
                pages["codes"][ids] = qt.codes.reshape(Hk, n, *lay.code_shape(1)[2:]).transpose(0, 1)
                for key, val in (("scales", qt.scales), ("zeros", qt.zeros)):
                    if pages[key] is not None:
                        pages[key][ids] = val.reshape(Hk, n, *lay.scale_shape(1)[2:]).transpose(0, 1)
                if spec.outliers:  # the outlier slots, per token
                    for key, val in (("out_idx", qt.out_idx), ("out_val", qt.out_val)):
                        pages[key][ids] = val.reshape(Hk, n, P, spec.outliers).transpose(0, 1)
            L = lens[b]
            tail = n * P - L  # poison the unused slots of the last page
            if tail and not spec.is_float_storage and pages["scales"] is not None:
                G = spec.group if spec.axis == "chan" else 1
                s = pages["scales"][ids[-1]]  # [Hk, P or P/G, ...]
                s[:, (L - (n - 1) * P) // G:] = float("nan") if s.dtype != torch.uint8 else 255
            elif tail and spec.is_float_storage:
                pages["codes"][ids[-1], :, L - (n - 1) * P:] = float("nan")
            if tail and spec.outliers:  # past-the-end slots: real channels, NaN values (read: NaN output)
                pages["out_val"][ids[-1], :, L - (n - 1) * P:] = float("nan")
        out[f"{name}_pages"] = pages
        out[f"{name}_ts"] = ts
    if fp_lens is not None:
        B = len(lens)
        W = max(fp_width, max(fp_lens), 1)
        for name in ("k", "v"):
            fp = torch.randn(B, Hk, W, D, generator=g)
            for b, F in enumerate(fp_lens):
                fp[b, :, F:] = float("nan")
            out[f"{name}_fp"] = fp.to(torch.bfloat16)
        out["fp_len"] = torch.tensor(fp_lens, dtype=torch.int32)
    else:
        out.update(k_fp=None, v_fp=None, fp_len=None)
    if device != "cpu":
        out = {k: (v.to(device) if isinstance(v, torch.Tensor) else
                   {kk: (vv.to(device) if vv is not None else None) for kk, vv in v.items()} if isinstance(v, dict)
                   else v) for k, v in out.items()}
    return out


def call_args(c):
    """Positional/keyword arguments of decode/extend from a `make_paged` dict."""
    return ((c["k_pages"], c["v_pages"], c["kv_indptr"], c["kv_indices"], c["kv_last_page_len"]),
            dict(k_fp=c["k_fp"], v_fp=c["v_fp"], fp_len=c["fp_len"], k_tensor_scale=c["k_ts"],
                 v_tensor_scale=c["v_ts"]))
