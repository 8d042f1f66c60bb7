"""Extend (chunked prefill) attention over a quantized paged prefix: checks and dispatch.

The chunk's own keys/values arrive in full precision (`k_new`/`v_new`); the prefix comes from the
quantized pages (`PageLayout`) plus the full-precision buffer, exactly as in `decode`.
"""
from __future__ import annotations

import torch

from ..decode.api import _need, check_common


def extend(q, k_new, v_new, qo_indptr, k_pages: dict, v_pages: dict, kv_indptr, kv_indices, kv_last_page_len,
           k_spec, v_spec, page_size: int, *, k_fp=None, v_fp=None, fp_len=None, k_tensor_scale=None,
           v_tensor_scale=None, sm_scale=None, backend: str = "triton", max_qo_len: int | None = None,
           config: dict | None = None, out=None):
    """Chunked-prefill attention.

    q:            [C, Hq, D] float32/float16/bfloat16, the chunk queries of all sequences (CSR by qo_indptr)
    k_new, v_new: [C, Hk, D] the chunk's keys/values in full precision (not yet in the cache)
    qo_indptr:    [B+1] int32/64 offsets of each sequence's chunk in q / k_new / v_new
    k_pages ... page_size, k_fp, v_fp, fp_len, k/v_tensor_scale, sm_scale: the prefix, as in `decode`
    max_qo_len:   longest chunk (optional; saves a device->host read of qo_indptr)
    Returns [C, Hq, D] in q.dtype. Query i of a chunk sees the whole prefix and chunk keys 0..i.
    """
    _need(isinstance(qo_indptr, torch.Tensor) and qo_indptr.dim() == 1 and qo_indptr.shape[0] >= 1 and
          qo_indptr.dtype in (torch.int32, torch.int64), "qo_indptr must be a 1-d int32/int64 tensor [B+1]")
    B = qo_indptr.shape[0] - 1
    info = check_common(q, k_pages, v_pages, kv_indptr, kv_indices, kv_last_page_len, k_spec, v_spec, page_size,
                        k_fp, v_fp, fp_len, k_tensor_scale, v_tensor_scale, backend, B)
    C, Hk, D = q.shape[0], info["Hk"], info["D"]
    for nm, t in (("k_new", k_new), ("v_new", v_new)):
        _need(isinstance(t, torch.Tensor) and tuple(t.shape) == (C, Hk, D), f"{nm} must be [C={C}, Hk={Hk}, D={D}], "
              f"got {getattr(t, 'shape', t)}")
        _need(t.dtype in (torch.float32, torch.float16, torch.bfloat16) and t.device == q.device and
              t.stride(-1) == 1, f"{nm} must be a float tensor on {q.device}, contiguous in its last dim")
    _need(qo_indptr.device == q.device, f"qo_indptr is on {qo_indptr.device}, q is on {q.device}")
    sm_scale = float(sm_scale) if sm_scale is not None else D ** -0.5
    args = (q, k_new, v_new, qo_indptr, k_pages, v_pages, kv_indptr, kv_indices, kv_last_page_len, info["k_spec"],
            info["v_spec"], page_size)
    kw = dict(k_fp=k_fp, v_fp=v_fp, fp_len=fp_len, k_tensor_scale=k_tensor_scale, v_tensor_scale=v_tensor_scale,
              sm_scale=sm_scale)
    if backend == "reference":
        from .reference import extend_reference
        return extend_reference(*args, **kw)
    if out is not None:
        _need(isinstance(out, torch.Tensor) and out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
              and out.device == q.device, f"out must be a contiguous {tuple(q.shape)} {q.dtype} tensor on {q.device}")
    from .triton import extend_triton
    return extend_triton(*args, **kw, max_qo_len=max_qo_len, config=config, out=out)
