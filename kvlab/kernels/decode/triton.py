"""Triton split-K (flash-decoding) attention over a paged quantized KV cache.

One program per (sequence, KV head, split): each K/V tile is read and dequantized once and
serves the whole GQA group through one `tl.dot` ([GP, D] x [D, BLOCK_N], GP = group padded to
>= 16). Online softmax in fp32; partial results of the splits are merged by `_merge_kernel`
(skipped with one split). The last split also attends the full-precision buffer.
"""
from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from ..dequant import chan_tile, tile_config, tok_tile
from .. import tuning


@triton.jit
def softmax_step(q, kt, v, valid, m_i, l_i, acc, kmul, vmul, DOT: tl.constexpr):
    """One online-softmax step. q [M, D] (scaled by log2 e), kt [D, N], v [N, D], valid [M, N] or [1, N];
    kmul / vmul: per-tensor scales of this K / V tile (1.0 for full-precision tokens).
    DOT: 0 fp32 tl.dot (ieee), 1 / 2 bf16 / fp16 tl.dot, 3 fp32 FMAs and reductions (M = the GQA
    group unpadded; small BLOCK_N keeps the [M, D, N] product in registers)."""
    if DOT == 0:
        s = tl.dot(q, kt.to(tl.float32), input_precision="ieee") * kmul
    elif DOT == 3:  # CUDA-core FMAs in the tile's own layout: no operand-layout conversion through smem
        s = tl.sum(q[:, :, None] * kt.to(tl.float32)[None, :, :], axis=1) * kmul
    else:
        s = tl.dot(q, kt.to(q.dtype)) * kmul
    s = tl.where(valid, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # fully masked rows stay at zero, not NaN
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if DOT == 0:
        pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    elif DOT == 3:
        pv = tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
    else:
        pv = tl.dot(p.to(q.dtype), v.to(q.dtype))
    return m_new, l_i, acc * alpha[:, None] + pv * vmul


@triton.jit
def softmax_step_t(qt, kr, v, valid, m_i, l_i, acc_t, kmul, vmul, DOT: tl.constexpr):
    """softmax_step in the KV-major orientation (config orient "kv"): scores^T = K q^T [N, M] and
    out^T += V^T p^T [D, M], so the big dequantized tiles are the dots' M-side operands (BN and D
    rows: wgmma-sized) and only q^T and p^T are the small N-side ones. qt [D, M], kr / v [N, D],
    valid [N, 1] or [N, M], acc_t [D, M]."""
    if DOT == 0:
        s = tl.dot(kr.to(tl.float32), qt, input_precision="ieee") * kmul
    else:
        s = tl.dot(kr.to(qt.dtype), qt) * kmul
    s = tl.where(valid, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 0))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[None, :])
    l_i = l_i * alpha + tl.sum(p, 0)
    if DOT == 0:
        pv = tl.dot(tl.trans(v.to(tl.float32)), p, input_precision="ieee")
    else:
        pv = tl.dot(tl.trans(v.to(qt.dtype)), p.to(qt.dtype))
    return m_new, l_i, acc_t * alpha[None, :] + pv * vmul


@triton.jit
def pin(x, ON: tl.constexpr):
    """Anchor a 16-bit tile in the layout it was computed in (GPU only; ON=0 is a no-op, used under the
    interpreter). A non-pure inline-asm move cannot be rematerialized, so Triton cannot hoist tl.dot's
    operand layout above it: the 16-bit row tile is what goes through shared memory (STS, then LDSM /
    ldmatrix(.trans) into the MMA) instead of the raw codes gathered byte by byte in the operand layout
    (H200 run3 diagnosis). Checked offline: benchmarks/NOTES_decode.md, run4."""
    if ON:
        x = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=x.dtype, is_pure=False, pack=2)
    return x


@triton.jit
def tensor_scales(KTS, VTS, HAS_KTS: tl.constexpr, HAS_VTS: tl.constexpr):
    """Per-tensor scales of the quantized K and V tiles (1.0 where the spec has none)."""
    kts = 1.0
    vts = 1.0
    if HAS_KTS:
        kts = tl.load(KTS)
    if HAS_VTS:
        vts = tl.load(VTS)
    return kts, vts


@triton.jit
def q_operand(q, DOT: tl.constexpr):
    """float32 queries in the dtype of the score dot (DOT 1: bf16, 2: fp16; else float32)."""
    if DOT == 1:
        q = q.to(tl.bfloat16)
    elif DOT == 2:
        q = q.to(tl.float16)
    return q


@triton.jit
def kv_tiles(q, KC, KS, KZ, KL, VC, VS, VZ, VL, IDX, t0, hi, hk, kperm, vperm,
             kc0, kc1, kc2, kc3, ks0, ks1, ks2, vc0, vc1, vc2, vc3, vs0, vs1, vs2,
             KCFG: tl.constexpr, VCFG: tl.constexpr, P: tl.constexpr, BN: tl.constexpr, D: tl.constexpr,
             ROWFIRST: tl.constexpr, PIN: tl.constexpr):
    """Dequantized K^T [D, BN] and V [BN, D] of tokens t0..t0+BN (rows past hi are 0); token- or
    channel-axis tiles per spec. ROWFIRST: the dot dtype (q's) in the load's row layout, anchored
    there (pin); bf16 / fp16 pages have nothing to dequantize and are left as they are."""
    if KCFG[26]:
        kt = chan_tile(KC, KS, KZ, KL, IDX, t0, hi, hk, kc0, kc1, kc2, kc3, ks0, ks1, ks2, KCFG, P, BN, D)
    else:
        kr = tok_tile(KC, KS, KZ, KL, IDX, t0, hi, hk, kperm, kc0, kc1, kc2, ks0, ks1, ks2, KCFG, P, BN, D)
        if ROWFIRST and KCFG[0] != 0:
            kr = pin(kr.to(q.dtype), PIN)
        kt = tl.trans(kr)
    if VCFG[26]:
        v = tl.trans(chan_tile(VC, VS, VZ, VL, IDX, t0, hi, hk, vc0, vc1, vc2, vc3, vs0, vs1, vs2, VCFG, P, BN, D))
    else:
        v = tok_tile(VC, VS, VZ, VL, IDX, t0, hi, hk, vperm, vc0, vc1, vc2, vs0, vs1, vs2, VCFG, P, BN, D)
        if ROWFIRST and VCFG[0] != 0:
            v = pin(v.to(q.dtype), PIN)
    return kt, v


@triton.jit
def fp_tile(KFP, VFP, b, hk, t0, F, kperm, vperm, kf0, kf1, kf2, vf0, vf1, vf2, BN: tl.constexpr):
    """Full-precision buffer tokens t0..t0+BN of sequence b (F held): K^T [D, BN], V [BN, D], mask [BN]."""
    t = t0 + tl.arange(0, BN)
    fm = t < F
    kt = tl.load(KFP + b * kf0 + hk * kf1 + t[None, :] * kf2 + kperm[:, None], mask=fm[None, :], other=0.0)
    v = tl.load(VFP + b * vf0 + hk * vf1 + t[:, None] * vf2 + vperm[None, :], mask=fm[:, None], other=0.0)
    return kt, v, fm


@triton.jit
def _decode_kernel(Q, OUT, OP, LSE, KC, KS, KZ, KL, KPERM, VC, VS, VZ, VL, VPERM, KTS, VTS,
                   INDPTR, INDICES, LAST, KFP, VFP, FPLEN, qk_scale, num_splits,
                   sq0, sq1, so0, so1, kc0, kc1, kc2, kc3, ks0, ks1, ks2, vc0, vc1, vc2, vc3, vs0, vs1, vs2,
                   kf0, kf1, kf2, vf0, vf1, vf2,
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
                         ks0, ks1, ks2, vc0, vc1, vc2, vc3, vs0, vs1, vs2, KCFG, VCFG, P, BN, D, ROWFIRST, PIN)
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
    o = tl.where(l_i[:, None] > 0, acc / tl.where(l_i > 0, l_i, 1.0)[:, None], 0.0)  # [GP, D], V's column order
    if DIRECT:
        tl.store(OUT + b * so0 + heads[:, None] * so1 + vperm[None, :], o.to(OUT.dtype.element_ty), mask=gm[:, None])
    else:
        row = (b * tl.num_programs(1) * GROUP + heads) * num_splits + sp  # [GP] rows of OP [B, Hq, S, D]
        tl.store(OP + row[:, None] * D + vperm[None, :], o, mask=gm[:, None])
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        tl.store(LSE + row, lse, mask=gm)


@triton.jit
def _merge_kernel(OP, LSE, OUT, num_splits, so0, so1, SP: tl.constexpr, D: tl.constexpr):
    """OP [B, Hq, S, D] fp32 partial outputs, LSE [B, Hq, S] (log2) -> OUT [B, Hq, D]."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, SP)
    sm = s < num_splits
    base = (b * tl.num_programs(1) + h) * num_splits
    lse = tl.load(LSE + base + s, mask=sm, other=float("-inf"))
    mx = tl.max(lse, 0)
    w = tl.exp2(lse - tl.where(mx == float("-inf"), 0.0, mx))  # [SP]
    d = tl.arange(0, D)
    o = tl.load(OP + (base + s)[:, None] * D + d[None, :], mask=sm[:, None], other=0.0)
    tot = tl.sum(w, 0)
    out = tl.sum(w[:, None] * o, 0) / tl.where(tot > 0, tot, 1.0)
    tl.store(OUT + b * so0 + h * so1 + d, out.to(OUT.dtype.element_ty))


# ---- host side ------------------------------------------------------------------------------------
_OFFLINE = False  # set by sm90_offline: compile GPU paths from CPU tensors
_UNIT = {4: torch.int32, 2: torch.int16, 1: torch.uint8}


def interpreting() -> bool:
    import os
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.lru_cache(maxsize=256)
def _cfg(spec, D: int, word_max: int, asm: bool, device: str, rowfirst: bool = False):
    cfg, perm = tile_config(spec, D, word_max, asm, rowfirst)
    lut = None
    if spec.fmt in ("nf4", "iq4nl"):
        from ...quant.formats import codebook
        lut = codebook(spec.fmt, device)
    return cfg, torch.tensor(perm, dtype=torch.int32, device=device), lut


def prepare(pages: dict, spec, D: int, asm: bool, q: torch.Tensor, tensor_scale, rowfirst: bool = False):
    """-> dict of kernel arguments for one cache tensor (unit views, strides, CFG, perm, LUT, tensor scale)."""
    codes = pages["codes"]
    word = 4
    if not spec.is_float_storage:
        while word > 1:
            try:
                view = codes.view(_UNIT[word])
                break
            except RuntimeError:
                word //= 2
        else:
            view = codes
    else:
        view = codes
    cfg, perm, lut = _cfg(spec, D, word, asm, str(q.device), rowfirst)
    if cfg[3] != word and not spec.is_float_storage:
        view = codes.view(_UNIT[cfg[3]])
    scales, zeros = pages.get("scales"), pages.get("zeros")
    if scales is not None and scales.dtype == torch.float8_e4m3fn:
        scales = scales.view(torch.uint8)  # e4m3 scales travel as bytes (bitcast in-kernel)
    dummy = perm
    lut = dummy if lut is None else lut
    ts = None
    if tensor_scale is not None and (spec.tensor_scale or (spec.axis == "tensor" and spec.has_scale)):
        ts = torch.as_tensor(tensor_scale, dtype=torch.float32, device=q.device).reshape(1)
    cs = list(view.stride()) + [0] * (5 - view.dim())
    inner = view.shape[2:]  # within-page dims must be dense: the kernels take their strides as constexprs
    if any(view.stride(i) != math.prod(inner[i - 1:]) for i in range(2, view.dim())):
        raise ValueError(f"page codes must be contiguous within a (page, head) tile; got strides {view.stride()}")
    if scales is not None and (scales.stride(-1) != 1 or scales.stride(2) != math.prod(scales.shape[3:])):
        raise ValueError(f"page scales must be contiguous within a (page, head) tile; got strides {scales.stride()}")
    ss = list(scales.stride()) if scales is not None else [0, 0, 0]
    if zeros is not None and zeros.stride() != scales.stride():
        raise ValueError("zeros must have the same strides as scales")
    return dict(c=view, s=scales if scales is not None else dummy, z=zeros if zeros is not None else dummy, lut=lut,
                perm=perm, ts=ts, cfg=cfg, cs=cs[:4] if cfg[26] else cs[:3] + [0], ss=ss[:3])


@functools.lru_cache(maxsize=32)
def hadamard_cached(D: int, device) -> torch.Tensor:
    from ...quant.rotation import hadamard
    return hadamard(D, device)


def rotate_inputs(q, ks, vs, k_spec, v_spec, D):
    """Hadamard-rotated specs: q -> q @ H for K (scores are invariant); the full-precision keys /
    values in `ks` / `vs` are rotated alike so the kernel sees one space; the caller un-rotates
    the output with H.T for V. Returns (q, ks, vs)."""
    if "had" not in (k_spec.rotation, v_spec.rotation):
        return q, ks, vs
    H = hadamard_cached(D, q.device)
    rot = (lambda t: None if t is None else t.float() @ H)  # noqa: E731
    if k_spec.rotation == "had":
        q, ks = rot(q), [rot(t) for t in ks]
    if v_spec.rotation == "had":
        vs = [rot(t) for t in vs]
    return q, ks, vs


DOT_MODES = {"fp32": 0, "bf16": 1, "fp16": 2, "fma": 3}


def dot_mode(cfg_dot: str | None, asm: bool) -> int:
    """Config "dot" -> the kernel's DOT: fp16 tl.dot after an fp16 fast path, "fma" (CUDA cores)
    when asked, else fp32 under the interpreter and bf16 on the GPU."""
    if cfg_dot is not None and cfg_dot not in DOT_MODES:
        raise ValueError(f"config dot={cfg_dot!r}; allowed: {', '.join(DOT_MODES)}")
    if cfg_dot == "fma":
        return 3
    if asm:
        return 2
    return DOT_MODES[cfg_dot or ("fp32" if interpreting() else "bf16")]


def decode_triton(q, k_pages, v_pages, kv_indptr, kv_indices, kv_last_page_len, k_spec, v_spec, P, *, k_fp, v_fp,
                  fp_len, k_tensor_scale, v_tensor_scale, sm_scale, num_splits=None, config=None, use_asm=None, out=None, plan=False):
    """See `kvlab.kernels.decode.decode`. Returns [B, Hq, D] in q.dtype (plan=True: a callable that
    re-launches on the same buffers, reading q in place: FlashInfer's plan once / run per step)."""
    B, Hq, D = q.shape
    dtype = q.dtype
    Hk = k_pages["codes"].shape[1]
    group = Hq // Hk
    cfg = dict(tuning.default_config("decode", B, Hk, q.device))
    if config is None:
        config = tuning.lookup("decode", k_spec, v_spec, B, Hq, Hk, D, P, q.device)
    cfg.update(config or {})
    S = int(num_splits or cfg.get("num_splits") or tuning.auto_splits(B, Hk, q.device))
    kernel = cfg.get("kernel") or "triton"
    if kernel not in ("triton", "gluon"):
        raise ValueError(f"config kernel={kernel!r}; allowed: 'triton', 'gluon' (MMA-fragment kernel; gluon_mma.why_not says which calls)")
    if kernel == "gluon":
        from . import gluon_mma
        why = gluon_mma.why_not(k_spec, v_spec, D, P, group, k_fp is not None, q.device)
        if why is not None:
            raise ValueError(f"config kernel='gluon' cannot run this call: {why}")
        return gluon_mma.decode_gluon(q, k_pages, v_pages, kv_indptr, kv_indices, kv_last_page_len, k_spec, v_spec, P,
                                      sm_scale=sm_scale, num_splits=S, k_fp=k_fp, v_fp=v_fp, fp_len=fp_len,
                                      k_tensor_scale=k_tensor_scale, v_tensor_scale=v_tensor_scale,
                                      num_warps=int(cfg.get("num_warps", 4)),
                                      tokens_per_warp=int(cfg.get("tokens_per_warp", 16)),
                                      maxnreg=cfg.get("maxnreg"), transpose_o=bool(cfg.get("ot", True)),
                                      out=out, plan=plan)
    asm = bool(cfg.get("asm", True) if use_asm is None else use_asm) and not interpreting() and (q.is_cuda or _OFFLINE)
    BN = int(cfg["BLOCK_N"])
    for s in (k_spec, v_spec):
        if s.axis == "chan":
            BN = max(BN, s.group)
    layout = cfg.get("layout") or "operand"
    if layout not in ("operand", "rowfirst"):
        raise ValueError(f"config layout={layout!r}; allowed: 'operand', 'rowfirst'")
    rowfirst = layout == "rowfirst"
    orient = cfg.get("orient") or "q"
    if orient not in ("q", "kv"):
        raise ValueError(f"config orient={orient!r}; allowed: 'q' (scores = q K^T), 'kv' (scores^T = K q^T)")
    K = prepare(k_pages, k_spec, D, asm, q, k_tensor_scale, rowfirst)
    V = prepare(v_pages, v_spec, D, asm, q, v_tensor_scale, rowfirst)
    half = bool(K["cfg"][27] or V["cfg"][27])  # a fast path makes fp16 tiles: fp16 dots
    dot = dot_mode(cfg.get("dot"), half)
    pin_on = rowfirst and dot in (1, 2) and not interpreting() and (q.is_cuda or _OFFLINE)
    out_dtype = torch.float32 if v_spec.rotation == "had" else dtype
    new = torch.full if interpreting() else (lambda shape, _, **kw: torch.empty(shape, **kw))  # NaN-poison on CPU
    user_out = out
    if out is None or out_dtype != dtype:
        out = new((B, Hq, D), float("nan"), dtype=out_dtype, device=q.device)
    op = lse = out
    if S > 1:
        op = new((B, Hq, S, D), float("nan"), dtype=torch.float32, device=q.device)
        lse = new((B, Hq, S), float("nan"), dtype=torch.float32, device=q.device)
    if orient == "kv" and dot == 3:
        raise ValueError("config orient='kv' runs tensor-core dots; it does not combine with dot='fma'")
    GP = triton.next_power_of_2(group) if dot == 3 else max(16, triton.next_power_of_2(group))  # tl.dot: M >= 16
    q_in, kfp_in, vfp_in = q, k_fp, v_fp
    extra = {} if interpreting() or not cfg.get("maxnreg") else {"maxnreg": int(cfg["maxnreg"])}  # register cap (occupancy)

    def launch():
        q, (k_fp,), (v_fp,) = rotate_inputs(q_in, [kfp_in], [vfp_in], k_spec, v_spec, D)
        has_fp = k_fp is not None
        kf, vf = (k_fp, v_fp) if has_fp else (out, out)
        kfs = k_fp.stride()[:3] if has_fp else (0, 0, 0)
        vfs = v_fp.stride()[:3] if has_fp else (0, 0, 0)
        _decode_kernel[(B, Hk, S)](
            q, out, op, lse, K["c"], K["s"], K["z"], K["lut"], K["perm"], V["c"], V["s"], V["z"], V["lut"],
            V["perm"], K["ts"] if K["ts"] is not None else out, V["ts"] if V["ts"] is not None else out,
            kv_indptr, kv_indices, kv_last_page_len, kf, vf, fp_len if has_fp else kv_last_page_len,
            sm_scale * 1.4426950408889634, S, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
            *K["cs"], *K["ss"], *V["cs"], *V["ss"], *kfs, *vfs,
            KCFG=K["cfg"], VCFG=V["cfg"], GROUP=group, GP=GP, D=D, P=P, BN=BN, HAS_FP=has_fp,
            HAS_KTS=K["ts"] is not None, HAS_VTS=V["ts"] is not None, DOT=dot,
            DIRECT=S == 1, ROWFIRST=int(rowfirst), PIN=int(pin_on), KVMAJOR=int(orient == "kv"), num_warps=int(cfg["num_warps"]), num_stages=int(cfg["num_stages"]), **extra)
        if S > 1:
            _merge_kernel[(B, Hq)](op, lse, out, S, out.stride(0), out.stride(1), SP=triton.next_power_of_2(S), D=D,
                                   num_warps=4)
        res = out
        if v_spec.rotation == "had":
            res = (out @ hadamard_cached(D, q.device).T).to(dtype)
            if user_out is not None:
                user_out.copy_(res)
                return user_out
        return res

    return launch if plan else launch()
