"""`store`: check inputs, rotate if the spec rotates, dispatch to the Triton kernel or the reference.

Neither Triton nor the kernel module is imported until the Triton backend runs.
"""
from __future__ import annotations

import os

import torch

from ...cache.layout import PageLayout
from ...cache.paging import prerotate
from ...quant.oracle import as_spec

BACKENDS = ("auto", "triton", "reference")
_FLOAT = (torch.float32, torch.float16, torch.bfloat16)


def _need(cond, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def supports_triton(spec) -> tuple[bool, str]:
    """(True, "") if the Triton store runs `spec`, else (False, why): the reference runs it instead."""
    spec = as_spec(spec)
    if spec.rule == "mse":
        return False, "rule=mse searches 21 clipping ratios per group; the store uses the torch reference for it"
    return True, ""


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _static(name, v, device) -> torch.Tensor:
    _need(isinstance(v, (float, int, torch.Tensor)), f"{name} must be a float or a 1-element tensor, got "
          f"{type(v).__name__}")
    t = torch.as_tensor(v, dtype=torch.float32).reshape(-1)
    _need(t.numel() == 1, f"{name} must hold one value, got {t.numel()}")
    return t.to(device)


def check_pages(pages, spec, D: int, Hk: int, device, page_size: int | None) -> tuple[PageLayout, int]:
    """Validate `pages` against PageLayout; returns (layout, number of pages)."""
    _need(isinstance(pages, dict) and isinstance(pages.get("codes"), torch.Tensor),
          "pages must be a dict with tensor 'codes' (and 'scales'/'zeros'), as PageLayout.allocate returns")
    codes = pages["codes"]
    _need(codes.dim() >= 4, f"pages['codes'] must have rank 4 (rank 5 for axis chan), got shape {tuple(codes.shape)}")
    P = codes.shape[2] * (spec.group if spec.axis == "chan" else 1)
    _need(page_size is None or page_size == P, f"page_size={page_size} but pages['codes'] holds {P} tokens per page")
    lay = PageLayout(spec, D, P, Hk)
    N = lay.check_pages(pages, device)
    for key in ("codes", "scales", "zeros"):
        t = pages.get(key)
        _need(t is None or t.is_contiguous(), f"pages[{key!r}] must be contiguous")
    return lay, N


def _check_slots(slots: torch.Tensor, n_slots: int, G: int | None) -> None:
    lo, hi = int(slots.min()), int(slots.max())
    _need(lo >= -1 and hi < n_slots, f"slot_mapping values must lie in [-1, {n_slots}) (-1 skips a token); got "
          f"[{lo}, {hi}]")
    if G:  # each run of G tokens fills one channel group: consecutive slots from a multiple of G
        s = slots.reshape(-1, G).to(torch.int64)
        run = (s[:, 0] % G == 0) & (s == s[:, :1] + torch.arange(G, device=s.device)).all(1)
        ok = run | (s == -1).all(1)
        _need(bool(ok.all()), f"axis chan: each run of {G} tokens needs consecutive slots starting at a multiple of "
              f"{G} (or all -1)")


def store(x: torch.Tensor, pages: dict, slot_mapping: torch.Tensor, spec, *, page_size: int | None = None,
          scale=None, tensor_scale=None, backend: str = "auto", check_slots: bool = True) -> str:
    """Quantize new tokens and write them into a paged cache tensor; returns the backend that ran.

    x:            [T, Hk, D] float32 / float16 / bfloat16 (keys post-RoPE unless spec.pre_rope)
    pages:        {"codes", "scales", "zeros"} of `PageLayout(spec, D, P, Hk).allocate(N)`
    slot_mapping: [T] int64 or int32, slot = page * P + offset; -1 skips the token. Axis chan:
                  T is a multiple of the group G and every run of G tokens has consecutive slots
                  starting at a multiple of G (one channel group of one page).
    spec:         KVQuantSpec or spec text
    scale:        static scale of an axis-tensor spec (float32; the pool calibrates it)
    tensor_scale: NVFP4's fp32 second-level scale (specs with `ts`)
    backend:      "auto" (Triton on CUDA tensors, else the reference), "triton" (CUDA, or CPU under
                  TRITON_INTERPRET=1), "reference". rule=mse always runs the reference: the kernel
                  does not implement the clipping-ratio search.
    check_slots:  verify slot ranges (one device sync); the pool, which builds slots itself, skips it.

    Codes and scales equal `kvlab.quantize` of the same tokens bit for bit (NaN scales excepted:
    their NaN payload may differ; the group's codes are the oracle's).
    """
    _need(backend in BACKENDS, f"backend={backend!r}; allowed: {', '.join(BACKENDS)}")
    spec = as_spec(spec)
    _need(isinstance(x, torch.Tensor) and x.dim() == 3, "x must be a tensor [T, Hk, D] (tokens, KV heads, head_dim)"
          f", got {tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    _need(x.dtype in _FLOAT, f"x dtype {x.dtype}; allowed: float32, float16, bfloat16")
    T, Hk, D = x.shape
    spec.check_head_dim(D)
    if spec.axis == "tensor" and not spec.is_float_storage:
        _need(spec.fmt == "int" or spec.fmt.startswith("fp8"), f"axis tensor with {spec.fmt} needs a static codebook "
              "scale, which the store does not support; use axis tok, head or chan")
    needs_scale = spec.axis == "tensor" and spec.has_scale and not spec.is_float_storage
    _need(needs_scale or scale is None, f"scale= is a static axis-tensor scale; spec {spec} does not take one")
    _need(not needs_scale or scale is not None, f"spec {spec} (axis tensor) needs scale= (its calibrated static scale)")
    _need(spec.tensor_scale or tensor_scale is None, f"tensor_scale= is NVFP4's second level; spec {spec} has none")
    _need(not spec.tensor_scale or tensor_scale is not None, f"spec {spec} needs tensor_scale= (fp32, calibrated)")
    lay, N = check_pages(pages, spec, D, Hk, x.device, page_size)
    _need(isinstance(slot_mapping, torch.Tensor) and slot_mapping.shape == (T,), f"slot_mapping must be a tensor [{T}]"
          f", got {tuple(slot_mapping.shape) if isinstance(slot_mapping, torch.Tensor) else type(slot_mapping)}")
    _need(slot_mapping.dtype in (torch.int64, torch.int32), f"slot_mapping dtype {slot_mapping.dtype}; allowed: "
          "int64, int32")
    _need(slot_mapping.device == x.device, f"slot_mapping is on {slot_mapping.device}, x on {x.device}")
    if spec.axis == "chan":
        _need(T % spec.group == 0, f"axis chan stores whole groups of {spec.group} tokens; got {T} tokens")
    if check_slots and T:
        _check_slots(slot_mapping, N * lay.page_size, spec.group if spec.axis == "chan" else None)
    s = _static("scale", scale, x.device) if scale is not None else None
    ts = _static("tensor_scale", tensor_scale, x.device) if tensor_scale is not None else None
    if backend == "auto":
        backend = "triton" if x.is_cuda else "reference"
    if backend == "triton" and not supports_triton(spec)[0]:
        backend = "reference"
    if backend == "triton":
        _need(x.is_cuda or _interpreting(), "backend 'triton' needs CUDA tensors, or TRITON_INTERPRET=1 (set before "
              "importing triton) to run on the CPU")
        from .triton import store_triton
        xr, spec_r = prerotate(x, spec)
        store_triton(xr, pages, slot_mapping, spec_r, lay.page_size, scale=s, tensor_scale=ts)
    else:
        from .reference import store_reference
        store_reference(x, pages, slot_mapping, spec, lay.page_size, scale=s, tensor_scale=ts)
    return backend
