"""Extend (chunked prefill) attention over a quantized paged prefix: checks, config, dispatch.

The chunk's own keys/values arrive in full precision (`k_new`/`v_new`); the prefix comes from the
quantized pages (`PageLayout`) plus the full-precision buffer, exactly as in `decode`. Backends:
`reference.py` (torch), `triton.py` (the fused kernel: dequantize in the inner loop) and `dense.py` (the
prefix dequantized once into a workspace and attended by cuDNN / flash with its log-sum-exp; the chunks' causal
parts attended by cuDNN (equal chunks) or flash varlen with theirs; a light Triton launch merges the states and attends
the full-precision buffer, or the fused kernel reads what the dense part left and merges); this module alone chooses,
through each backend's `why_not`.
On a GPU, backend="auto" hands the chunks' causal part to cuDNN / flash (one call for the batch) when the longest
chunk has at least dense.CHUNK_MIN_ROWS (query, head) rows per KV head: the fused kernel spent 0.31 ms on a
1,024-token chunk at Hq 32 (runs/extend-profile-bea6665), a quarter of the whole call.
backend="auto" takes the dense prefix on a GPU for a sequence whose chunk has at least DENSE_MIN_ROWS (query, head)
rows per KV head, whose prefix holds at least one 2048-token bucket, and whose prefix attention costs at least
DENSE_MIN_FLOPS (4 x Hq x chunk x prefix x D), or DENSE_MIN_FLOPS_SLOW for the families the fused kernel dequantizes
slowly (`slow_in_fused`); the fused kernel otherwise. The thresholds come from the H200 table
(sweeps/results/h200/runs/extend-6259b1c): the dense path carried about 1 ms of fixed cost per call, so it won at a
32K prefix (B = 1: 2.1-3.3x cuDNN against the fused 2.5-23x) and lost at 8K for the fast codecs (q4_0 6.5x against
4.0x) and at head_dim 64 (13-24x against 3-9x). Most of that cost was a device-to-host read of the lengths, which
`host_lens` removes (B = 1 x 32K: 1.4-2.1x cuDNN at f7b71a9). With the chunk in flash (runs/extend-chunk-622972b,
extend_dense_vs_fused.csv, host lengths, 8K prefix, 1K chunk): at head_dim 256 (6.9e10 flops) the dense prefix ran
kivi4 0.78 ms against the fused 1.67, fp8 0.82 / 1.94, q4_0 1.03 / 1.11, bf16 1.22 / 0.98, so DENSE_MIN_FLOPS fell from
1e11 to 5e10; at SmolLM2's shape (1.9e10) the fused prefix stays (0.26-0.41 ms against 0.95-1.35: the dense path's
host work, ~0.7 ms a call, dominates there).
"""
from __future__ import annotations

import functools
import numbers

import torch

from ..checks import FLOAT_DTYPES, INDEX_DTYPES, check_out, check_prefix, check_query, check_sm_scale, need
from ..configs import ExtendConfig, config_from_dict
from ..env import interpreting, on_gpu
from ..key_fold import stored_chunk_keys, strip_key_fold
from ..tuned import attention_key, lookup

BACKENDS = ("auto", "triton", "dense", "onecall", "reference")
DENSE_MIN_ROWS = 128    # chunk rows (tokens x query heads per KV head) below which the fused kernel is as fast
DENSE_MIN_PREFIX = 2048  # prefix tokens below which the workspace pass and host planning cost more than they save
DENSE_MIN_FLOPS = 5e10       # per sequence, for codecs the fused kernel reads fast (bf16, 2-6-bit ints, fp4, KIVI)
DENSE_MIN_FLOPS_SLOW = 1e10  # per sequence, for fp8, int8, codebooks and rotations (`slow_in_fused`), and for every
# family inside a graph (`graphs.py`): with the host work replayed away the dense path's GPU time decides; SmolLM2's
# 8K shape (1.9e10) replayed 0.150 ms for fp8 (dense) against 0.253 bf16 / 0.333 q4_0 (fused) (runs/s21-0dc8c93)
GRAPH_CUDNN_CHUNK_MIN_FLOPS = 0.0  # inside a graph every equal chunk goes to one cuDNN call (B 1 x 8K: 0.297-0.306 ms
# against flash's 0.333-0.344, runs/s21c-f596efc; outside, dense.CUDNN_CHUNK_MIN_FLOPS: cuDNN's host time decides)


def extend(q, k_new, v_new, qo_indptr, k_pages: dict, v_pages: dict, kv_indptr, kv_indices, kv_last_page_len,
           k_spec, v_spec, page_size: int, *, k_fp=None, v_fp=None, fp_len=None, k_tensor_scale=None,
           v_tensor_scale=None, sm_scale=None, backend: str = "auto", max_qo_len: int | None = None,
           config=None, out=None, dense_bucket: int = 2048, host_lens=None, graphs: bool = True):
    """Chunked-prefill attention.

    q:            [C, Hq, D] float32/float16/bfloat16, the chunk queries of all sequences (CSR by qo_indptr)
    k_new, v_new: [C, Hk, D] the chunk's keys/values in full precision (not yet in the cache; the model's keys:
                  for a `smooth` K spec, q is multiplied and k_new divided by k_pages["smooth"] here, exactly; a
                  `perm` K spec's q and k_new are gathered in k_pages["perm"]'s channel order)
    qo_indptr:    [B+1] int32/64 offsets of each sequence's chunk in q / k_new / v_new
    k_pages ... page_size, k_fp, v_fp, fp_len, k/v_tensor_scale, sm_scale: the prefix, as in `decode`
    max_qo_len:   longest chunk (optional; saves a device->host read of qo_indptr on the fused path)
    backend:      "auto" (default), "triton" (fused kernel only), "dense" (dense prefix for every sequence with a
                  prefix; needs a GPU, or TRITON_INTERPRET=1 on the CPU), "onecall" (prefix, buffer and chunk in one
                  workspace and one cuDNN call with a bottom-right causal mask: chunks of one length, the cuDNN
                  frontend on the GPU; `onecall.py`) or "reference" (float32 torch)
    dense_bucket: backend="dense" only: the dense part covers whole buckets of this many prefix tokens (auto: 2048)
    config:       an `ExtendConfig` or its dict (default: the tuned store's entry, else ExtendConfig())
    host_lens:    optional host copies (lists or CPU tensors) of (qo_indptr, kv_indptr, kv_last_page_len), equal to
                  the device tensors, as FlashInfer's `plan` takes them: the dense path then plans without reading
                  the lengths back from the device (no synchronization, so the host runs ahead of the GPU); a pool
                  knows them on the host. Also gives max_qo_len when that is None.
    graphs:       a batch-1 call with host_lens on a GPU (auto / dense backend) whose key was seen twice is captured
                  into a CUDA graph and replayed from then on (`graphs.py`: the key, what a replay copies, memory);
                  False keeps every call eager (so does KVLAB_EXTEND_GRAPHS=0)
    Returns [C, Hq, D] in q.dtype. Query i of a chunk sees the whole prefix and chunk keys 0..i.
    """
    need(backend in BACKENDS, lambda: f"backend={backend!r}; allowed: {', '.join(map(repr, BACKENDS))}")
    need(isinstance(graphs, bool), lambda: f"graphs={graphs!r}; allowed: True or False")
    need(isinstance(qo_indptr, torch.Tensor) and qo_indptr.dim() == 1 and qo_indptr.shape[0] >= 1 and
         qo_indptr.dtype in INDEX_DTYPES, "qo_indptr must be a 1-d int32/int64 tensor [B+1]")
    B = qo_indptr.shape[0] - 1
    Hq, D = check_query(q, "C")
    q, k_pages, k_spec, fold = strip_key_fold(q, k_pages, k_spec)  # smoothed / permuted K: q * s, k_new / s below
    kv = check_prefix(q, k_pages, v_pages, kv_indptr, kv_indices, kv_last_page_len, k_spec, v_spec, page_size,
                      k_fp, v_fp, fp_len, k_tensor_scale, v_tensor_scale, B)
    C, Hk = q.shape[0], kv.n_kv_heads
    for nm, t in (("k_new", k_new), ("v_new", v_new)):
        need(isinstance(t, torch.Tensor) and tuple(t.shape) == (C, Hk, D),
             lambda: f"{nm} must be [C={C}, Hk={Hk}, D={D}], got {getattr(t, 'shape', t)}")
        need(t.dtype in FLOAT_DTYPES and t.device == q.device and t.stride(-1) == 1,
             lambda: f"{nm} must be a float tensor on {q.device}, contiguous in its last dim")
    need(qo_indptr.device == q.device, lambda: f"qo_indptr is on {qo_indptr.device}, q is on {q.device}")
    k_new = stored_chunk_keys(k_new, fold)
    sm_scale = check_sm_scale(sm_scale, D)
    check_out(out, q)
    if host_lens is not None:
        host_lens = check_host_lens(host_lens, qo_indptr, kv, C)
        if max_qo_len is None:
            max_qo_len = max((b - a for a, b in zip(host_lens[0], host_lens[0][1:])), default=0)
    if backend == "reference":
        from . import reference
        return reference.run(q, k_new, v_new, qo_indptr, kv, sm_scale)
    from . import dense, onecall, triton
    from . import graphs as graph_mod
    if config is not None:
        cfg = config_from_dict("extend", config)
    else:
        cfg = (lookup(attention_key("extend", kv.k_spec, kv.v_spec, B, Hq, Hk, D, page_size))
               or heuristic_config(D, Hq // Hk, max_qo_len))
    why = triton.why_not(q, kv, cfg)
    need(why is None, why)
    if backend == "dense":
        G = max([s.group for s in (kv.k_spec, kv.v_spec) if s.axis == "chan"] + [1])
        need(isinstance(dense_bucket, int) and dense_bucket >= 1 and dense_bucket % G == 0,
             lambda: f"dense_bucket={dense_bucket!r}; allowed: a positive int, a multiple of the channel-axis group "
             f"{G}")
        why = dense.why_not(q, kv)
        need(why is None, why)
    if backend == "onecall":
        if host_lens is None:  # one synchronization: the workspace's size and the chunks' lengths come from the host
            host_lens = dense._host_lists(qo_indptr, kv)
        why = onecall.why_not(q, kv, host_lens[0])
        need(why is None, why)
    static = (sm_scale, backend, cfg, max_qo_len, dense_bucket)
    if graph_mod.wanted(graphs, q, B, host_lens, backend):
        return graph_mod.call(_dispatch, q, k_new, v_new, qo_indptr, kv, host_lens, out, static,
                              dense_bucket if backend == "dense" else dense.BUCKET)
    return _dispatch(q, k_new, v_new, qo_indptr, kv, host_lens, out, *static)


def _dispatch(q, k_new, v_new, qo_indptr, kv, host_lens, out, sm_scale, backend, cfg, max_qo_len, dense_bucket):
    """The call after its checks: which parts go dense (cuDNN / flash) and the fused or merge launch."""
    from . import dense, onecall, triton
    from . import graphs as graph_mod
    Hq, Hk = q.shape[1], kv.n_kv_heads
    blocked = _capturing(q) and not graph_mod.building()  # another capture: the dense path would read lengths back
    if backend == "onecall" or (backend == "auto" and onecall.ENABLED and host_lens is not None and on_gpu()
                                and q.is_cuda and not blocked and _worth_dense(kv, qo_indptr, Hq // Hk, max_qo_len)
                                and onecall.why_not(q, kv, host_lens[0]) is None):
        if backend == "onecall":
            res = onecall.run(q, k_new, v_new, qo_indptr, kv, sm_scale, host_lens, out, dense.BUCKET)
            need(res is not None, lambda: "backend='onecall': cuDNN refused this attention shape "
                 f"(Hq {Hq}, Hk {Hk}, D {q.shape[-1]}) or its workspace exceeds onecall.MAX_WORKSPACE")
            return res
        try:  # auto: anything the one-call path cannot do (a refused shape, memory) falls back to the dense path
            res = onecall.run(q, k_new, v_new, qo_indptr, kv, sm_scale, host_lens, out, dense.BUCKET)
        except Exception as e:  # noqa: BLE001 - said once (`onecall.fell_back`), never silently per call
            onecall.fell_back(e)
            res = None
        if res is not None:
            return res
    prefix = chunk = None
    host_qo = host_lens[0] if host_lens is not None else None
    # equal chunks to one cuDNN call from this many flops (inside a graph, where host time is replayed away: all)
    cudnn_min = GRAPH_CUDNN_CHUNK_MIN_FLOPS if graph_mod.building() else dense.CUDNN_CHUNK_MIN_FLOPS
    if backend == "dense":
        chunk = functools.partial(_dense_chunk, dense, qo_indptr, sm_scale, 0, host_qo, cudnn_min)
        prefix = functools.partial(_dense_prefix, dense, kv, qo_indptr, sm_scale, 1, 1, dense_bucket, 0.0, host_lens)
    elif (backend == "auto" and on_gpu() and cfg.dot in (None, "bf16", "fp16") and not blocked
          and dense.why_not(q, kv) is None and _worth_dense(kv, qo_indptr, Hq // Hk, max_qo_len)):
        slow = slow_in_fused(kv.k_spec) or slow_in_fused(kv.v_spec)
        min_flops = DENSE_MIN_FLOPS_SLOW if slow or graph_mod.building() else DENSE_MIN_FLOPS
        prefix = functools.partial(_dense_prefix, dense, kv, qo_indptr, sm_scale, DENSE_MIN_ROWS, DENSE_MIN_PREFIX,
                                   dense.BUCKET, min_flops, host_lens)
    if backend == "auto" and on_gpu() and q.is_cuda and cfg.dot in (None, "bf16", "fp16") and not blocked:
        chunk = functools.partial(_dense_chunk, dense, qo_indptr, sm_scale, dense.CHUNK_MIN_ROWS, host_qo,
                                  cudnn_min)
    return triton.run(q, k_new, v_new, qo_indptr, kv, sm_scale, cfg, max_qo_len=max_qo_len, out=out, prefix=prefix,
                      chunk=chunk)


def heuristic_config(D: int, group: int, max_qo_len: int | None) -> ExtendConfig:
    """The fused kernel's config where no tuned entry matches. Chunks of 128+ rows at head_dim <= 128 take 128 x 128
    tiles and 8 warps: the H200 sweep at a 32K prefix measured them fastest of seven configs for bf16 (2.12 vs 3.41 ms
    with ExtendConfig()), q4_0 (2.82 vs 5.19) and kivi4 (3.43 vs 6.53) (sweeps/results/h200/runs/extend-2863614);
    shorter chunks and head_dim 256 keep ExtendConfig()'s 64 x 32 tiles (fewer padded rows, fewer registers)."""
    if D <= 128 and (max_qo_len is None or max_qo_len * group >= 128) and not interpreting():
        return ExtendConfig(block_m=128, block_n=128, num_warps=8, num_stages=2)
    return ExtendConfig()


def _worth_dense(kv, qo_indptr, group: int, max_qo_len) -> bool:
    """Cheap host-side test before any device read: some chunk can reach DENSE_MIN_ROWS rows and the block table
    can hold DENSE_MIN_PREFIX tokens."""
    if max_qo_len is not None and max_qo_len * group < DENSE_MIN_ROWS:
        return False
    return kv.kv_indices.shape[0] * kv.page_size >= DENSE_MIN_PREFIX


def _capturing(q) -> bool:
    """A CUDA graph is being captured on q's stream: the dense path reads lengths back to the host, so it is skipped."""
    return q.is_cuda and torch.cuda.is_current_stream_capturing()


def slow_in_fused(spec) -> bool:
    """Families the fused kernel dequantizes slowly (H200, B = 1 x 32K, fused / cuDNN: fp8_e4m3 8.5x, q8_0 8.8x, nf4
    and iq4nl 23x, against 2.5-4.4x for bf16, 2-6-bit ints, fp4 and KIVI): fp8, 8-bit ints, 16-entry codebooks
    other than fp4; and the Lloyd-Max codebooks and Hadamard-rotated specs, whose fused path also rotates q and the
    output in torch (SmolLM2's 8K shape, fused at 1.9e10 flops: lm2 / lm3 / lm4 16x cuDNN, int4_had 13x, against
    2.6-6.7x for the others; sweeps/results/h200/runs/s16b-5ee5d62), while the dense path fuses the rotations."""
    return (spec.fmt.startswith("fp8") or (spec.fmt == "int" and spec.bits == 8)
            or spec.fmt in ("nf4", "iq4nl", "lm2", "lm3", "lm4") or spec.calibrated or spec.rotation == "had")


def _dense_prefix(dense, kv, qo_indptr, sm_scale, min_rows, min_prefix, bucket, min_flops, host_lens, q, ops,
                  rotate_q):
    return dense.attend_prefixes(q, qo_indptr, kv, sm_scale, min_rows=min_rows, min_prefix=min_prefix, bucket=bucket,
                                 min_flops=min_flops, host_lens=host_lens, ops=ops, rotate_q=rotate_q)


def _dense_chunk(dense, qo_indptr, sm_scale, min_rows, host_qo, cudnn_min, q, k_new, v_new, max_qo_len):
    return dense.attend_chunks(q, k_new, v_new, qo_indptr, max_qo_len, sm_scale, min_rows=min_rows, host_qo=host_qo,
                               cudnn_min_flops=cudnn_min)


def check_host_lens(host_lens, qo_indptr, kv, qo_indptr_total: int) -> tuple[list, list, list]:
    """host_lens as three int lists (qo_indptr [B+1], kv_indptr [B+1], kv_last_page_len [B]) with the device tensors'
    sizes, offsets that start at 0, do not decrease and stay within the chunk (C) and the page list, last-page lengths
    within a page; on the CPU (no synchronization to save) also their values."""
    names = ("qo_indptr", "kv_indptr", "kv_last_page_len")
    dev = (qo_indptr, kv.kv_indptr, kv.kv_last_page_len)
    need(isinstance(host_lens, (tuple, list)) and len(host_lens) == 3,
         lambda: f"host_lens must be ({', '.join(names)}) as lists or CPU tensors, got {type(host_lens).__name__}")
    out = []
    for nm, h, d in zip(names, host_lens, dev):
        if isinstance(h, torch.Tensor):
            need(h.device.type == "cpu" and h.dim() == 1, lambda: f"host_lens {nm} must be a 1-d CPU tensor or a list")
            h = h.tolist()
        need(isinstance(h, (list, tuple)) and all(isinstance(x, numbers.Integral) and not isinstance(x, bool)
                                                   for x in h), f"host_lens {nm} must be a list of ints")
        need(len(h) == d.shape[0], lambda: f"host_lens {nm} has {len(h)} entries, the device tensor {d.shape[0]}")
        out.append([int(x) for x in h])
    qo, ind, last = out  # what the host can check for free on any device
    for nm, ptr, total in (("qo_indptr", qo, qo_indptr_total), ("kv_indptr", ind, kv.kv_indices.shape[0])):
        need(ptr[0] == 0 and all(a <= b for a, b in zip(ptr, ptr[1:])) and ptr[-1] <= total,
             lambda: f"host_lens {nm} must start at 0, not decrease and end within {total}: {ptr[:8]}")
    need(all(0 <= x <= kv.page_size for x in last),
         lambda: f"host_lens kv_last_page_len must lie in [0, {kv.page_size}]")
    for nm, h, d in zip(names, out, dev):
        if not d.is_cuda:
            need(h == d.tolist(), lambda: f"host_lens {nm} {h[:8]} differs from the device tensor {d.tolist()[:8]}")
    return tuple(out)
