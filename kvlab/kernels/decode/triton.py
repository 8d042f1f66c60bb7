"""Triton split-K (flash-decoding) attention over a paged quantized KV cache.

One program per (sequence, KV head, split): each K/V tile is read and dequantized once and
serves the whole GQA group through one `tl.dot` ([GP, D] x [D, BLOCK_N], GP = group padded to
>= 16). Online softmax in fp32; partial results of the splits are merged by `tiles.attention.merge_kernel`
(skipped with one split). The last split also attends the full-precision buffer.

Backend contract (called by `api.py` only): `why_not(q, kv, config)` says why this kernel cannot run a
call (None when it can); `run(q, kv, sm_scale, config, out, plan)` launches it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..configs import TritonDecodeConfig
from ..env import gpu_codegen, interpreting, poisoned
from ...quant.rotation import hadamard
from ..paged import PagedKV, rotate_inputs
from ..tiles.attention import fp_tile, kv_tiles, q_operand, softmax_step, softmax_step_t, tensor_scales
from ..tiles.operands import LOG2E, dot_mode, fused_unrotation, merge_splits, page_operands, slot_args, unsupported

@triton.jit
def _decode_kernel(Q, OUT, OP, LSE, KC, KS, KZ, KL, KPERM, VC, VS, VZ, VL, VPERM, KTS, VTS,
                   INDPTR, INDICES, LAST, KFP, VFP, FPLEN, qk_scale, num_splits,
                   sq0, sq1, so0, so1, kc0, kc1, kc2, kc3, ks0, ks1, ks2, vc0, vc1, vc2, vc3, vs0, vs1, vs2,
                   kf0, kf1, kf2, vf0, vf1, vf2, KSI, KSV, VSI, VSV, kso0, kso1, vso0, vso1,
                   KCFG: tl.constexpr, VCFG: tl.constexpr, GROUP: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
                   P: tl.constexpr, BN: tl.constexpr, HAS_FP: tl.constexpr, HAS_KTS: tl.constexpr,
                   HAS_VTS: tl.constexpr, DOT: tl.constexpr, DIRECT: tl.constexpr,
                   ROWFIRST: tl.constexpr = 0, PIN: tl.constexpr = 0, KVMAJOR: tl.constexpr = 0):
    b = tl.program_id(0)
    hk = tl.program_id(1)
    sp = tl.program_id(2)
    p0 = tl.load(INDPTR + b)
    p1 = tl.load(INDPTR + b + 1)
    L = tl.where(p1 > p0, (p1 - p0 - 1) * P + tl.load(LAST + b), 0).to(tl.int32)  # quantized tokens
    per = tl.cdiv(tl.cdiv(L, num_splits), BN) * BN  # tokens per split, whole tiles
    lo = sp * per
    hi = tl.minimum(lo + per, L)
    IDX = INDICES + p0
    g = tl.arange(0, GP)
    d = tl.arange(0, D)
    gm = g < GROUP
    heads = hk * GROUP + g  # [GP] query heads served by this KV head
    kperm = tl.load(KPERM + d)
    vperm = tl.load(VPERM + d)
    kts, vts = tensor_scales(KTS, VTS, HAS_KTS, HAS_VTS)
    q = tl.load(Q + b * sq0 + heads[:, None] * sq1 + kperm[None, :], mask=gm[:, None], other=0.0).to(tl.float32)
    q = q_operand(q * qk_scale, DOT)  # [GP, D], dims in K's column order
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, D], tl.float32)
    if KVMAJOR:
        qt = tl.trans(q)                  # [D, GP]
        acc = tl.zeros([D, GP], tl.float32)  # out^T
    for t0 in range(lo, hi, BN):
        kt, v = kv_tiles(q, KC, KS, KZ, KL, VC, VS, VZ, VL, IDX, t0, hi, hk, kperm, vperm, kc0, kc1, kc2, kc3,
                         ks0, ks1, ks2, vc0, vc1, vc2, vc3, vs0, vs1, vs2, KCFG, VCFG, P, BN, D, ROWFIRST, PIN, KSI, KSV, VSI, VSV, kso0, kso1, vso0, vso1)
        valid = (t0 + tl.arange(0, BN)) < hi
        if KVMAJOR:
            m_i, l_i, acc = softmax_step_t(qt, tl.trans(kt), v, valid[:, None], m_i, l_i, acc, kts, vts, DOT)
        else:
            m_i, l_i, acc = softmax_step(q, kt, v, valid[None, :], m_i, l_i, acc, kts, vts, DOT)
    if HAS_FP:
        if sp == num_splits - 1:  # the full-precision tokens ride on the last split
            F = tl.load(FPLEN + b)
            for t0 in range(0, F, BN):
                kt, v, fm = fp_tile(KFP, VFP, b, hk, t0, F, kperm, vperm, kf0, kf1, kf2, vf0, vf1, vf2, BN)
                if KVMAJOR:
                    m_i, l_i, acc = softmax_step_t(qt, tl.trans(kt), v, fm[:, None], m_i, l_i, acc, 1.0, 1.0, DOT)
                else:
                    m_i, l_i, acc = softmax_step(q, kt, v, fm[None, :], m_i, l_i, acc, 1.0, 1.0, DOT)
    if KVMAJOR:
        acc = tl.trans(acc)  # [GP, D]
    # rows that saw no token are 0; a NaN sum (a non-finite key or value) stays NaN: l_i != 0, not > 0
    o = tl.where(l_i[:, None] != 0, acc / tl.where(l_i != 0, l_i, 1.0)[:, None], 0.0)  # [GP, D], V's column order
    if DIRECT:
        tl.store(OUT + b * so0 + heads[:, None] * so1 + vperm[None, :], o.to(OUT.dtype.element_ty), mask=gm[:, None])
    else:
        row = (b * tl.num_programs(1) * GROUP + heads) * num_splits + sp  # [GP] rows of OP [B, Hq, S, D]
        tl.store(OP + row[:, None] * D + vperm[None, :], o, mask=gm[:, None])
        lse = tl.where(l_i != 0, m_i + tl.log2(tl.where(l_i != 0, l_i, 1.0)), float("-inf"))
        tl.store(LSE + row, lse, mask=gm)


def why_not(q: torch.Tensor, kv: PagedKV, config: TritonDecodeConfig) -> str | None:
    """None when this kernel runs the call; else why not."""
    return unsupported(q, kv)


def run(q, kv: PagedKV, sm_scale: float, config: TritonDecodeConfig, out=None, plan: bool = False):
    """Launch the decode (and merge) kernels. q [B, Hq, D]; config.num_splits already resolved.
    Returns [B, Hq, D] in q.dtype, or with plan=True a callable that re-launches on the same buffers
    (q read in place each call: FlashInfer's plan once / run per step; CUDA-graph friendly)."""
    B, Hq, D = q.shape
    dtype = q.dtype
    Hk = kv.n_kv_heads
    group = Hq // Hk
    S = config.num_splits
    asm = config.asm and gpu_codegen(q)
    BN = max([config.block_n] + [s.group for s in (kv.k_spec, kv.v_spec) if s.axis == "chan"])
    rowfirst = config.layout == "rowfirst"
    K = page_operands(kv.k_pages, kv.k_spec, D, asm, q.device, kv.k_tensor_scale, rowfirst)
    V = page_operands(kv.v_pages, kv.v_spec, D, asm, q.device, kv.v_tensor_scale, rowfirst)
    dot = dot_mode(config.dot, K["half"] or V["half"])  # a fast path makes fp16 tiles: fp16 dots
    pin_on = rowfirst and dot in (1, 2) and gpu_codegen(q)
    rot_v = kv.rotated[1]
    merge_unrotates = rot_v and S > 1 and bool(fused_unrotation(D))  # the merge kernel un-rotates (one H block)
    out_dtype = torch.float32 if rot_v and not merge_unrotates else dtype
    user_out = out
    if out is None or out_dtype != dtype:
        out = poisoned((B, Hq, D), out_dtype, q.device)
    op = lse = out
    if S > 1:
        op = poisoned((B, Hq, S, D), torch.float32, q.device)
        lse = poisoned((B, Hq, S), torch.float32, q.device)
    GP = triton.next_power_of_2(group) if dot == 3 else max(16, triton.next_power_of_2(group))  # tl.dot: M >= 16
    extra = {} if interpreting() or config.maxnreg is None else {"maxnreg": config.maxnreg}

    def launch():
        qr, (k_fp,), (v_fp,) = rotate_inputs(q, [kv.k_fp], [kv.v_fp], kv.k_spec, kv.v_spec, D)
        has_fp = k_fp is not None
        kf, vf = (k_fp, v_fp) if has_fp else (out, out)
        _decode_kernel[(B, Hk, S)](
            qr, out, op, lse, K["c"], K["s"], K["z"], K["lut"], K["perm"], V["c"], V["s"], V["z"], V["lut"],
            V["perm"], out if K["ts"] is None else K["ts"], out if V["ts"] is None else V["ts"],
            kv.kv_indptr, kv.kv_indices, kv.kv_last_page_len, kf, vf, kv.fp_len if has_fp else kv.kv_last_page_len,
            sm_scale * LOG2E, S, qr.stride(0), qr.stride(1), out.stride(0), out.stride(1),
            *K["cs"], *K["ss"], *V["cs"], *V["ss"], *(kf.stride()[:3] if has_fp else (0, 0, 0)),
            *(vf.stride()[:3] if has_fp else (0, 0, 0)), *slot_args(K, V),
            KCFG=K["cfg"], VCFG=V["cfg"], GROUP=group, GP=GP, D=D, P=kv.page_size, BN=BN, HAS_FP=has_fp,
            HAS_KTS=K["ts"] is not None, HAS_VTS=V["ts"] is not None, DOT=dot, DIRECT=S == 1, ROWFIRST=int(rowfirst),
            PIN=int(pin_on), KVMAJOR=int(config.orient == "kv"), num_warps=config.num_warps,
            num_stages=config.num_stages, **extra)
        if S > 1:
            merge_splits(op, lse, out, rotated=merge_unrotates)
        if not rot_v or merge_unrotates:
            return out
        res = (out @ hadamard(D, q.device).T).to(dtype)  # the pages hold v H: out H^T
        if user_out is not None:
            user_out.copy_(res)
            return user_out
        return res

    return launch if plan else launch()
