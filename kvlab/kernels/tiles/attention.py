"""Triton attention steps shared by the decode and extend kernels (device code only).

Online softmax in fp32 (`softmax_step`, and `softmax_step_t` in the KV-major orientation), the
dequantized K/V tiles of a token block (`kv_tiles`, via `dequant`), the full-precision buffer's
tiles (`fp_tile`), the split-K merge (`merge_kernel`: partial outputs + log-sum-exps -> output) and the
full-precision tokens attended beside that merge (`fp_merge_kernel`).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .dequant import chan_tile, tok_tile
from .layout import F_CHAN, F_KIND, F_OUTL
from .rotate import fwht_rows


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
    (diagnosis and offline SASS: benchmarks/NOTES_decode.md)."""
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
             ROWFIRST: tl.constexpr, PIN: tl.constexpr, KOI=None, KOV=None, VOI=None, VOV=None, ko0=0, ko1=0, vo0=0,
             vo1=0):
    """Dequantized K^T [D, BN] and V [BN, D] of tokens t0..t0+BN (rows past hi are 0); token- or
    channel-axis tiles per spec. ROWFIRST: the dot dtype (q's) in the load's row layout, anchored
    there (pin); bf16 / fp16 pages have nothing to dequantize and are left as they are. KOI / KOV (VOI / VOV):
    the outlier slots of an `out=N` spec (page / head strides ko0 / ko1), read only when its cfg has them."""
    kt = tl.trans(_rows(q, KC, KS, KZ, KL, IDX, t0, hi, hk, kperm, kc0, kc1, kc2, kc3, ks0, ks1, ks2, KCFG, P, BN, D,
                        ROWFIRST, PIN, KOI, KOV, ko0, ko1))
    v = _rows(q, VC, VS, VZ, VL, IDX, t0, hi, hk, vperm, vc0, vc1, vc2, vc3, vs0, vs1, vs2, VCFG, P, BN, D, ROWFIRST, PIN,
              VOI, VOV, vo0, vo1)
    return kt, v


@triton.jit
def _rows(q, C, S, Z, LUT, IDX, t0, hi, h, perm, c0, c1, c2, c3, s0, s1, s2, CFG: tl.constexpr, P: tl.constexpr,
          BN: tl.constexpr, D: tl.constexpr, ROWFIRST: tl.constexpr, PIN: tl.constexpr, OI, OV, o0, o1):
    """One cache tensor's tile as rows [BN, D]: token-axis tiles as loaded (in the dot dtype and pinned under
    ROWFIRST), channel-axis tiles transposed; outlier slots written over their channels."""
    if CFG[F_CHAN]:
        x = tl.trans(chan_tile(C, S, Z, LUT, IDX, t0, hi, h, c0, c1, c2, c3, s0, s1, s2, CFG, P, BN, D))
        if CFG[F_OUTL] > 0:
            x = slot_values(x, OI, OV, IDX, t0, hi, h, perm, o0, o1, CFG[F_OUTL], P, BN)
    else:
        x = tok_tile(C, S, Z, LUT, IDX, t0, hi, h, perm, c0, c1, c2, s0, s1, s2, CFG, P, BN, D)
        if CFG[F_OUTL] > 0:
            x = slot_values(x, OI, OV, IDX, t0, hi, h, perm, o0, o1, CFG[F_OUTL], P, BN)
        if ROWFIRST and CFG[F_KIND] != 0:
            x = pin(x.to(q.dtype), PIN)
    return x


@triton.jit
def slot_values(x, OI, OV, IDX, t0, hi, h, perm, o0, o1, N: tl.constexpr, P: tl.constexpr, BN: tl.constexpr):
    """Rows x [BN, D] (column c = channel perm[c]) of tokens t0..t0+BN with each token's N outlier slots written
    over their channels: indices OI (uint8) and fp16 values OV, [pages, Hk, P, N] (page / head strides o0 / o1).
    Rows past hi are left as they are."""
    t = t0 + tl.arange(0, BN)
    valid = t < hi
    pg = tl.load(IDX + t // P, mask=valid, other=0).to(tl.int64)
    base = pg * o0 + h * o1 + (t % P) * N  # [BN]
    for j in tl.static_range(N):
        oi = tl.load(OI + base + j, mask=valid, other=255).to(tl.int32)  # 255: no channel (head_dim <= 256)
        ov = tl.load(OV + base + j, mask=valid, other=0.0)
        x = tl.where(perm[None, :] == oi[:, None], ov[:, None].to(x.dtype), x)
    return x


@triton.jit
def fp_tile(KFP, VFP, b, hk, t0, F, kperm, vperm, kf0, kf1, kf2, vf0, vf1, vf2, BN: tl.constexpr):
    """Full-precision buffer tokens t0..t0+BN of sequence b (F held): K^T [D, BN], V [BN, D], mask [BN]."""
    t = t0 + tl.arange(0, BN)
    fm = t < F
    kt = tl.load(KFP + b * kf0 + hk * kf1 + t[None, :] * kf2 + kperm[:, None], mask=fm[None, :], other=0.0)
    v = tl.load(VFP + b * vf0 + hk * vf1 + t[:, None] * vf2 + vperm[None, :], mask=fm[:, None], other=0.0)
    return kt, v, fm


@triton.jit
def merge_kernel(OP, LSE, OUT, num_splits, so0, so1, SP: tl.constexpr, D: tl.constexpr, ROT: tl.constexpr = 0,
                 RC: tl.constexpr = 1.0):
    """OP [B, Hq, S, D] fp32 partial outputs, LSE [B, Hq, S] (log2) -> OUT [B, Hq, D]. ROT = log2(D) > 0: the
    partials are rotated (the pages hold v H, H the symmetric normalized Hadamard matrix of one D-block; RC its
    float32 1/sqrt(D)): the merged row is un-rotated here, out H^T = out H, by the fast transform (`fwht_rows`)."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, SP)
    sm = s < num_splits
    base = (b * tl.num_programs(1) + h) * num_splits
    lse = tl.load(LSE + base + s, mask=sm, other=float("-inf"))
    mx = tl.max(lse, 0)
    w = tl.exp2(lse - tl.where(mx == float("-inf"), 0.0, mx))  # [SP]
    d = tl.arange(0, D)
    # a split without tokens (lse -inf) may have left its partial unwritten: it is not read
    o = tl.load(OP + (base + s)[:, None] * D + d[None, :], mask=(sm & (lse != float("-inf")))[:, None], other=0.0)
    tot = tl.sum(w, 0)
    out = tl.sum(w[:, None] * o, 0) / tl.where(tot != 0, tot, 1.0)
    if ROT > 0:
        out = tl.reshape(fwht_rows(tl.reshape(out, [1, D]), 1, D, ROT, RC), [D])
    tl.store(OUT + b * so0 + h * so1 + d, out.to(OUT.dtype.element_ty))


@triton.jit
def fp_merge_kernel(OP, LSE, Q, KF, VF, FPLEN, OUT, UOUT, num_splits, qk_scale, sq0, sq1, kf0, kf1, kf2, vf0, vf1,
                    vf2, so0, so1, GROUP: tl.constexpr, SP: tl.constexpr, D: tl.constexpr, BW: tl.constexpr,
                    ROT: tl.constexpr, RC: tl.constexpr = 1.0):
    """The full-precision tokens (sinks, window) of sequence b for query head h, merged with the split partials of
    its paged tokens. Grid (B, Hq): one head a program (the window is short; B x Hq programs fill the GPU where
    B x Hk would not), fp32 FMAs and reductions, no tensor-core shape to pad to.
    OP [B, Hq, S, D] fp32 split outputs, LSE [B, Hq, S] (log2); Q [B, Hq, D] the unrotated query; KF / VF
    [B, Hk, W, D] the full-precision tokens as stored (FPLEN [B] used); qk_scale = sm_scale * log2 e.
    ROT (the pages hold v H): -1: OUT [B, Hq, D] fp32 gets the paged part (still rotated) and UOUT [B, Hq, D] fp32 the
    full-precision part, both divided by the common softmax sum, so out = OUT H^T + UOUT; log2(D) > 0 (H one
    D-block, symmetric, RC its float32 1/sqrt(D)): the paged part is un-rotated here by the fast transform and OUT
    (any float dtype, strides so0 / so1) gets the whole output, as it does with ROT 0."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    hk = h // GROUP
    d = tl.arange(0, D)
    q = tl.load(Q + b * sq0 + h * sq1 + d).to(tl.float32) * qk_scale  # [D]
    F = tl.load(FPLEN + b)
    # online softmax over the full-precision tokens, kept as a scalar max / sum and a [D] accumulator
    m = tl.max(tl.full([BW], float("-inf"), tl.float32), 0)
    lsum = tl.sum(tl.zeros([BW], tl.float32), 0)
    acc = tl.zeros([D], tl.float32)
    for f0 in range(0, F, BW):
        t = f0 + tl.arange(0, BW)
        tm = t < F
        k = tl.load(KF + b * kf0 + hk * kf1 + t[:, None] * kf2 + d[None, :], mask=tm[:, None], other=0.0)
        s = tl.sum(k.to(tl.float32) * q[None, :], 1)  # [BW]
        s = tl.where(tm, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_safe)
        p = tl.exp2(s - m_safe)
        lsum = lsum * alpha + tl.sum(p, 0)
        v = tl.load(VF + b * vf0 + hk * vf1 + t[:, None] * vf2 + d[None, :], mask=tm[:, None], other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)
        m = m_new
    # the paged part: S partials (normalized outputs and their log2-sum-exps), one common maximum with the window's
    row = (b * tl.num_programs(1) + h) * num_splits
    sp = tl.arange(0, SP)
    lse = tl.load(LSE + row + sp, mask=sp < num_splits, other=float("-inf"))  # [SP]
    lse_fp = tl.where(lsum != 0, m + tl.log2(tl.where(lsum != 0, lsum, 1.0)), float("-inf"))
    mx = tl.maximum(tl.max(lse, 0), lse_fp)
    mx = tl.where(mx == float("-inf"), 0.0, mx)
    w = tl.exp2(lse - mx)  # [SP]
    o = tl.load(OP + (row + sp)[:, None] * D + d[None, :], mask=((sp < num_splits) & (lse != float("-inf")))[:, None],
                other=0.0)  # a split without tokens (lse -inf) may have left its partial unwritten
    main = tl.sum(w[:, None] * o, 0)  # [D]
    # the window's part: acc / lsum weighted by 2^(lse_fp - mx) = acc * 2^(m - mx)
    wf = tl.exp2(tl.where(lsum != 0, m, float("-inf")) - mx)
    tot = tl.sum(w, 0) + tl.where(lsum != 0, lsum * wf, 0.0)
    inv = 1.0 / tl.where(tot != 0, tot, 1.0)
    if ROT < 0:
        orow = (b * tl.num_programs(1) + h) * D + d
        tl.store(OUT + orow, main * inv)
        tl.store(UOUT + orow, acc * wf * inv)
    elif ROT > 0:
        main = tl.reshape(fwht_rows(tl.reshape(main * inv, [1, D]), 1, D, ROT, RC), [D])
        tl.store(OUT + b * so0 + h * so1 + d, (main + acc * wf * inv).to(OUT.dtype.element_ty))
    else:
        tl.store(OUT + b * so0 + h * so1 + d, ((main + acc * wf) * inv).to(OUT.dtype.element_ty))
