"""Decode attention over a paged, quantized KV cache: input checks and dispatch.

`decode(q, k_pages, v_pages, kv_indptr, kv_indices, kv_last_page_len, k_spec, v_spec, page_size, ...)`
attends one query token per sequence to its quantized pages (CSR block table, FlashInfer
style) plus its full-precision tokens (`k_fp`/`v_fp`, `fp_len` per sequence). The page tensors
follow `kvlab.cache.layout.PageLayout`. This module never imports Triton at import time.
"""
from __future__ import annotations

import torch

from ...cache.layout import PageLayout
from ...quant.oracle import as_spec
from ...spec import KVQuantSpec

TRITON_HEAD_DIMS = (32, 64, 128, 256)  # power-of-two head dims the Triton kernels tile (tl.arange needs 2^k)
_FLOAT = (torch.float32, torch.float16, torch.bfloat16)


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def check_pages(name: str, pages, spec: KVQuantSpec, D: int, P: int, Hk: int, device) -> int:
    """Validate one page dict against `PageLayout`; returns the number of pages N."""
    return PageLayout(spec, D, P, Hk).check_pages(pages, device, name, other="q")


def check_spec(name: str, spec, D: int, backend: str, tensor_scale) -> KVQuantSpec:
    spec = as_spec(spec)
    spec.check_head_dim(D)
    if spec.tensor_scale or (spec.axis == "tensor" and spec.has_scale and not spec.is_float_storage):
        _need(tensor_scale is not None, f"{name}_tensor_scale is required for spec {spec} (per-tensor scale kept by "
              "the pool, not the pages)")
    if backend == "triton":
        _need(not spec.pre_rope, f"{name}_spec {spec} stores keys before RoPE; the Triton kernels do not apply RoPE "
              "in-kernel yet; use backend='reference'")
        _need(not (spec.axis == "tensor" and not spec.sym), f"{name}_spec {spec}: axis tensor with a zero point is not "
              "supported by the Triton kernels; use backend='reference'")
    return spec


def check_common(q, k_pages, v_pages, kv_indptr, kv_indices, kv_last_page_len, k_spec, v_spec, page_size,
                 k_fp, v_fp, fp_len, k_tensor_scale, v_tensor_scale, backend: str, B: int) -> dict:
    """Checks shared by decode and extend. q: [*, Hq, D]. Returns normalized specs and sizes."""
    _need(backend in ("triton", "reference"), f"backend={backend!r}; allowed: 'triton', 'reference'")
    _need(isinstance(q, torch.Tensor) and q.dim() == 3, f"q must be a 3-d tensor [tokens, Hq, D], got "
          f"{getattr(q, 'shape', type(q).__name__)}")
    _need(q.dtype in _FLOAT, f"q dtype {q.dtype}; allowed: float32, float16, bfloat16")
    Hq, D = q.shape[1], q.shape[2]
    if backend == "triton":
        _need(D in TRITON_HEAD_DIMS, f"head_dim {D} is not supported by the Triton kernels (supported: "
              f"{TRITON_HEAD_DIMS}); use backend='reference'")
    _need(isinstance(page_size, int) and page_size >= 1, f"page_size must be an int >= 1, got {page_size!r}")
    k_spec = check_spec("k", k_spec, D, backend, k_tensor_scale)
    v_spec = check_spec("v", v_spec, D, backend, v_tensor_scale)
    _need(not v_spec.pre_rope, "v_spec has pre_rope; only keys can be stored before RoPE")
    codes = k_pages.get("codes") if isinstance(k_pages, dict) else None
    _need(isinstance(codes, torch.Tensor) and codes.dim() >= 2, "k_pages['codes'] must be a page tensor [N, Hk, ...]")
    Hk = codes.shape[1]
    _need(Hk >= 1 and Hq % Hk == 0, f"Hq={Hq} query heads is not a multiple of Hk={Hk} KV heads")
    nk = check_pages("k_pages", k_pages, k_spec, D, page_size, Hk, q.device)
    nv = check_pages("v_pages", v_pages, v_spec, D, page_size, Hk, q.device)
    _need(nk == nv, f"k_pages has {nk} pages but v_pages has {nv}")
    for nm, t, n in (("kv_indptr", kv_indptr, B + 1), ("kv_last_page_len", kv_last_page_len, B)):
        _need(isinstance(t, torch.Tensor) and t.dim() == 1 and t.shape[0] == n, f"{nm} must be a 1-d tensor of {n} "
              f"entries, got {getattr(t, 'shape', t)}")
    for nm, t in (("kv_indptr", kv_indptr), ("kv_indices", kv_indices), ("kv_last_page_len", kv_last_page_len)):
        _need(isinstance(t, torch.Tensor) and t.dtype in (torch.int32, torch.int64), f"{nm} must be int32/int64")
        _need(t.device == q.device, f"{nm} is on {t.device}, q is on {q.device}")
    _need(kv_indices.dim() == 1, "kv_indices must be 1-d")
    _need((k_fp is None) == (v_fp is None) == (fp_len is None), "give k_fp, v_fp and fp_len together (or none)")
    if k_fp is not None:
        for nm, t in (("k_fp", k_fp), ("v_fp", v_fp)):
            _need(isinstance(t, torch.Tensor) and t.dim() == 4 and t.shape[0] == B and t.shape[1] == Hk and
                  t.shape[3] == D, f"{nm} must be [B={B}, Hk={Hk}, W, D={D}], got {tuple(t.shape)}")
            _need(t.dtype in _FLOAT and t.device == q.device, f"{nm} must be a float tensor on {q.device}")
            _need(t.stride(-1) == 1, f"{nm} must be contiguous in its last dim")
        _need(k_fp.shape == v_fp.shape, f"k_fp {tuple(k_fp.shape)} and v_fp {tuple(v_fp.shape)} differ")
        _need(isinstance(fp_len, torch.Tensor) and tuple(fp_len.shape) == (B,) and fp_len.device == q.device,
              f"fp_len must be a [B={B}] tensor on {q.device}")
    return dict(k_spec=k_spec, v_spec=v_spec, Hq=Hq, Hk=Hk, D=D)


def decode(q, k_pages: dict, v_pages: dict, kv_indptr, kv_indices, kv_last_page_len, k_spec, v_spec, page_size: int,
           *, k_fp=None, v_fp=None, fp_len=None, k_tensor_scale=None, v_tensor_scale=None, sm_scale=None,
           backend: str = "triton", num_splits: int | None = None, config: dict | None = None, use_asm=None, out=None,
           plan: bool = False):
    """Paged decode attention over a quantized cache.

    q:                [B, Hq, D] float32/float16/bfloat16 (one new token per sequence)
    k_pages, v_pages: page dicts {"codes", "scales", "zeros"} laid out as `PageLayout(spec, D, page_size, Hk)`
    kv_indptr:        [B+1] int32/64, CSR offsets into kv_indices; kv_indices: page ids of every sequence, in order
    kv_last_page_len: [B] tokens used in each sequence's last page (1..page_size; ignored for 0 pages)
    k_spec, v_spec:   `KVQuantSpec` or spec text
    k_fp, v_fp:       [B, Hk, W, D] full-precision tokens (sinks, window, unfinished group); fp_len [B] used
    k/v_tensor_scale: per-tensor float (axis-tensor static scale or NVFP4's fp32 second-level scale)
    sm_scale:         softmax scale (default 1/sqrt(D)); num_splits: split-K count (default: tuned/auto)
    config:           {"BLOCK_N", "num_warps", "num_stages", "num_splits", "asm", "dot", "layout", "orient"}
                      (default: tuned cache); {"kernel": "gluon", "num_warps", "tokens_per_warp", "num_splits"}
                      runs the Gluon MMA-fragment kernel (q4_0 / q8_0 / int8 g32 / fp8_e4m3, D 128, CUDA;
                      `gluon_mma.why_not` says why a call cannot)
    use_asm:          fp16 magic-number nibble conversion via inline PTX (GPU only; default from config)
    out:              optional [B, Hq, D] tensor of q.dtype to write into (Triton backend)
    plan:             return a zero-argument callable that re-launches the kernels on the same buffers
                      (q read in place each call; checks and page views done once; CUDA-graph friendly)
    Returns [B, Hq, D] in q.dtype: softmax(q K^T * sm_scale) V over all tokens of each sequence.
    """
    B = q.shape[0] if isinstance(q, torch.Tensor) and q.dim() == 3 else -1
    info = check_common(q, k_pages, v_pages, kv_indptr, kv_indices, kv_last_page_len, k_spec, v_spec, page_size,
                        k_fp, v_fp, fp_len, k_tensor_scale, v_tensor_scale, backend, B)
    if num_splits is not None:
        _need(isinstance(num_splits, int) and 1 <= num_splits <= 256, f"num_splits must be an int in 1..256, "
              f"got {num_splits!r}")
    sm_scale = float(sm_scale) if sm_scale is not None else info["D"] ** -0.5
    args = (q, k_pages, v_pages, kv_indptr, kv_indices, kv_last_page_len, info["k_spec"], info["v_spec"], page_size)
    kw = dict(k_fp=k_fp, v_fp=v_fp, fp_len=fp_len, k_tensor_scale=k_tensor_scale, v_tensor_scale=v_tensor_scale,
              sm_scale=sm_scale)
    if backend == "reference":
        from .reference import decode_reference
        if plan:
            return lambda: decode_reference(*args, **kw)
        return decode_reference(*args, **kw)
    from .triton import decode_triton
    if out is not None:
        _need(isinstance(out, torch.Tensor) and out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
              and out.device == q.device, f"out must be a contiguous {tuple(q.shape)} {q.dtype} tensor on {q.device}")
    return decode_triton(*args, **kw, num_splits=num_splits, config=config, use_asm=use_asm, out=out, plan=plan)
