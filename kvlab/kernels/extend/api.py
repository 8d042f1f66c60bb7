"""Extend (chunked prefill) attention over a quantized paged prefix: checks, config, dispatch.

The chunk's own keys/values arrive in full precision (`k_new`/`v_new`); the prefix comes from the
quantized pages (`PageLayout`) plus the full-precision buffer, exactly as in `decode`. Backends:
`reference.py` (torch) and `triton.py`; this module alone chooses, through the backend's `why_not`.
"""
from __future__ import annotations

import torch

from ..checks import FLOAT_DTYPES, INDEX_DTYPES, check_out, check_prefix, check_query, check_sm_scale, need
from ..configs import ExtendConfig, config_from_dict
from ..tuned import attention_key, lookup

BACKENDS = ("triton", "reference")


def extend(q, k_new, v_new, qo_indptr, k_pages: dict, v_pages: dict, kv_indptr, kv_indices, kv_last_page_len,
           k_spec, v_spec, page_size: int, *, k_fp=None, v_fp=None, fp_len=None, k_tensor_scale=None,
           v_tensor_scale=None, sm_scale=None, backend: str = "triton", max_qo_len: int | None = None,
           config=None, out=None):
    """Chunked-prefill attention.

    q:            [C, Hq, D] float32/float16/bfloat16, the chunk queries of all sequences (CSR by qo_indptr)
    k_new, v_new: [C, Hk, D] the chunk's keys/values in full precision (not yet in the cache)
    qo_indptr:    [B+1] int32/64 offsets of each sequence's chunk in q / k_new / v_new
    k_pages ... page_size, k_fp, v_fp, fp_len, k/v_tensor_scale, sm_scale: the prefix, as in `decode`
    max_qo_len:   longest chunk (optional; saves a device->host read of qo_indptr)
    config:       an `ExtendConfig` or its dict (default: the tuned store's entry, else ExtendConfig())
    Returns [C, Hq, D] in q.dtype. Query i of a chunk sees the whole prefix and chunk keys 0..i.
    """
    need(backend in BACKENDS, f"backend={backend!r}; allowed: {', '.join(map(repr, BACKENDS))}")
    need(isinstance(qo_indptr, torch.Tensor) and qo_indptr.dim() == 1 and qo_indptr.shape[0] >= 1 and
         qo_indptr.dtype in INDEX_DTYPES, "qo_indptr must be a 1-d int32/int64 tensor [B+1]")
    B = qo_indptr.shape[0] - 1
    Hq, D = check_query(q, "C")
    kv = check_prefix(q, k_pages, v_pages, kv_indptr, kv_indices, kv_last_page_len, k_spec, v_spec, page_size,
                      k_fp, v_fp, fp_len, k_tensor_scale, v_tensor_scale, B)
    C, Hk = q.shape[0], kv.n_kv_heads
    for nm, t in (("k_new", k_new), ("v_new", v_new)):
        need(isinstance(t, torch.Tensor) and tuple(t.shape) == (C, Hk, D), f"{nm} must be [C={C}, Hk={Hk}, D={D}], "
             f"got {getattr(t, 'shape', t)}")
        need(t.dtype in FLOAT_DTYPES and t.device == q.device and t.stride(-1) == 1,
             f"{nm} must be a float tensor on {q.device}, contiguous in its last dim")
    need(qo_indptr.device == q.device, f"qo_indptr is on {qo_indptr.device}, q is on {q.device}")
    sm_scale = check_sm_scale(sm_scale, D)
    check_out(out, q)
    if backend == "reference":
        from . import reference
        return reference.run(q, k_new, v_new, qo_indptr, kv, sm_scale)
    from . import triton
    if config is not None:
        cfg = config_from_dict("extend", config)
    else:
        cfg = lookup(attention_key("extend", kv.k_spec, kv.v_spec, B, Hq, Hk, D, page_size)) or ExtendConfig()
    why = triton.why_not(q, kv, cfg)
    need(why is None, why)
    return triton.run(q, k_new, v_new, qo_indptr, kv, sm_scale, cfg, max_qo_len=max_qo_len, out=out)
