"""Input checks shared by the attention ops' `api.py` files: each bad argument gets a ValueError that
names it and says what is allowed, before any kernel sees it. No Triton import."""
from __future__ import annotations

import torch

from ..cache.layout import PageLayout
from ..spec import as_spec
from .paged import PagedKV

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


def need(cond: bool, msg) -> None:
    """Raise ValueError(msg) unless cond; msg may be a callable returning the text, so that a check on every
    attention call formats its message only when it fails."""
    if not cond:
        raise ValueError(msg() if callable(msg) else msg)


def check_query(q, what: str = "tokens") -> tuple[int, int]:
    """q must be a float tensor [what, Hq, D]; returns (Hq, D)."""
    need(isinstance(q, torch.Tensor) and q.dim() == 3, lambda: f"q must be a 3-d tensor [{what}, Hq, D], got "
         f"{getattr(q, 'shape', type(q).__name__)}")
    need(q.dtype in FLOAT_DTYPES, lambda: f"q dtype {q.dtype}; allowed: float32, float16, bfloat16")
    return q.shape[1], q.shape[2]


def _check_spec(name: str, spec, D: int, tensor_scale):
    spec = as_spec(spec)
    spec.check_head_dim(D)
    need(not spec.needs_tensor_scale or tensor_scale is not None,
         lambda: f"{name}_tensor_scale is required for spec {spec} (per-tensor scale kept by the pool, not the pages)")
    return spec


def check_prefix(q, k_pages, v_pages, kv_indptr, kv_indices, kv_last_page_len, k_spec, v_spec, page_size, k_fp,
                 v_fp, fp_len, k_tensor_scale, v_tensor_scale, B: int) -> PagedKV:
    """Check the paged prefix of `decode` / `extend` against q [*, Hq, D] and B sequences; returns it as a
    PagedKV (specs parsed; tensor scales kept only where the spec needs one)."""
    Hq, D = q.shape[1], q.shape[2]
    need(isinstance(page_size, int) and page_size >= 1, lambda: f"page_size must be an int >= 1, got {page_size!r}")
    k_spec = _check_spec("k", k_spec, D, k_tensor_scale)
    v_spec = _check_spec("v", v_spec, D, v_tensor_scale)
    need(not v_spec.pre_rope, "v_spec has pre_rope; only keys can be stored before RoPE")
    codes = k_pages.get("codes") if isinstance(k_pages, dict) else None
    need(isinstance(codes, torch.Tensor) and codes.dim() >= 2, "k_pages['codes'] must be a page tensor [N, Hk, ...]")
    Hk = codes.shape[1]
    need(Hk >= 1 and Hq % Hk == 0, lambda: f"Hq={Hq} query heads is not a multiple of Hk={Hk} KV heads")
    nk = PageLayout(k_spec, D, page_size, Hk).check_pages(k_pages, q.device, "k_pages", other="q")
    nv = PageLayout(v_spec, D, page_size, Hk).check_pages(v_pages, q.device, "v_pages", other="q")
    need(nk == nv, lambda: f"k_pages has {nk} pages but v_pages has {nv}")
    for nm, t, n in (("kv_indptr", kv_indptr, B + 1), ("kv_last_page_len", kv_last_page_len, B)):
        need(isinstance(t, torch.Tensor) and t.dim() == 1 and t.shape[0] == n,
             lambda: f"{nm} must be a 1-d tensor of {n} entries, got {getattr(t, 'shape', t)}")
    for nm, t in (("kv_indptr", kv_indptr), ("kv_indices", kv_indices), ("kv_last_page_len", kv_last_page_len)):
        need(isinstance(t, torch.Tensor) and t.dtype in INDEX_DTYPES, lambda: f"{nm} must be int32/int64")
        need(t.device == q.device, lambda: f"{nm} is on {t.device}, q is on {q.device}")
    need(kv_indices.dim() == 1, "kv_indices must be 1-d")
    need((k_fp is None) == (v_fp is None) == (fp_len is None), "give k_fp, v_fp and fp_len together (or none)")
    if k_fp is not None:
        for nm, t in (("k_fp", k_fp), ("v_fp", v_fp)):
            need(isinstance(t, torch.Tensor) and t.dim() == 4 and t.shape[0] == B and t.shape[1] == Hk and
                 t.shape[3] == D, lambda: f"{nm} must be [B={B}, Hk={Hk}, W, D={D}], got {tuple(t.shape)}")
            need(t.dtype in FLOAT_DTYPES and t.device == q.device, lambda: f"{nm} must be a float tensor on {q.device}")
            need(t.stride(-1) == 1, lambda: f"{nm} must be contiguous in its last dim")
        need(k_fp.shape == v_fp.shape, lambda: f"k_fp {tuple(k_fp.shape)} and v_fp {tuple(v_fp.shape)} differ")
        need(isinstance(fp_len, torch.Tensor) and tuple(fp_len.shape) == (B,) and fp_len.device == q.device,
             lambda: f"fp_len must be a [B={B}] tensor on {q.device}")
    return PagedKV(k_pages, v_pages, kv_indptr, kv_indices, kv_last_page_len, k_spec, v_spec, page_size, k_fp, v_fp,
                   fp_len, k_tensor_scale if k_spec.needs_tensor_scale else None,
                   v_tensor_scale if v_spec.needs_tensor_scale else None)


def check_out(out, q) -> None:
    """`out` (when given) must be a contiguous tensor of q's shape, dtype and device."""
    need(out is None or (isinstance(out, torch.Tensor) and out.shape == q.shape and out.dtype == q.dtype and
                         out.is_contiguous() and out.device == q.device),
         f"out must be a contiguous {tuple(q.shape)} {q.dtype} tensor on {q.device}")


def check_sm_scale(sm_scale, D: int) -> float:
    """The softmax scale: 1/sqrt(D) by default, else a positive finite float."""
    if sm_scale is None:
        return D ** -0.5
    need(isinstance(sm_scale, (int, float)) and 0 < float(sm_scale) < float("inf"),
         lambda: f"sm_scale must be a positive finite float, got {sm_scale!r}")
    return float(sm_scale)
