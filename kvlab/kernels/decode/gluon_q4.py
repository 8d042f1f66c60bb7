"""Gluon split-K decode for GGML-packed 4-bit KV (q4_0): dequantized straight into MMA fragments.

Why this exists: the Triton kernel (`triton.py`) hands `tl.dot` a dequantized tile, and Triton
routes that tile through shared memory into the tensor-core operand layout. On the H200 that
round trip (137 M shared-memory wavefronts for q4_0 at B=32 x 32K) is what holds q4_0 at 0.34 of
its bytes' roofline (benchmarks/NOTES_decode.md). Gluon lets a kernel name its register layouts,
so here every thread loads exactly the code bytes its `mma.sync.m16n8k16` fragments need
(16 contiguous bytes per key row, 8 per value row) and turns them into fp16 fragment registers
with PRMT / LOP3 / HFMA2 / HMUL2: no shared memory in the main loop at all.

Work split: one program per (sequence, KV head, split) as in `triton.py`; its NW warps each own
TW = 16 consecutive tokens of every NW * TW token tile (one page slice) and keep their own online
softmax state (a batched MMA: dim 0 of every tensor is the warp), merged across warps once at the
end. The GQA group rides in the MMA's M = 16 rows.

Orderings (the contraction and the output columns may be permuted freely):
- Scores: contraction index kappa = h + 2 r + 8 b + 32 wi  <->  head-dim channel
  32 r + 4 wi + b + 16 h (byte j = 16 r + 4 wi + b of the row, nibble h). A thread with
  lane % 4 = r then holds bytes 16 r .. 16 r + 15 of its token: one 128-bit load, one scale.
- Values: output column n = g + 8 (h + 2 k + 8 we)  <->  channel of byte j = 8 g + 4 we + k,
  nibble h. A thread with lane // 4 = g holds bytes 8 g .. 8 g + 7 of four token rows; the two
  tokens of one fragment register come from two rows (PRMT picks one byte of each).

Only on CUDA (sm_80+); there is no interpreter for Gluon, so CPU CI checks that it compiles for
sm_90 (tests/kernels/decode/test_gluon_q4.py) and the GPU tests check it against the reference.
"""
from __future__ import annotations

import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as ttgl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

# Set True once the GPU tests (tests/kernels/decode/test_gluon_q4.py, `bash benchmarks/h200_run.sh gluon`) have
# passed on a GPU: until then the tuner does not offer this kernel (it times, it does not check results);
# `config={"kernel": "gluon"}` runs it on request. KVLAB_GLUON=1 lets the tuner offer it anyway.
GPU_VERIFIED = False

PAGE_UNIT = 16  # page sizes must be multiples of this; tokens per warp per tile TW is 16 or 32 (config)
GP = ttgl.constexpr(16)  # MMA rows: the GQA group, padded

# fp16 magic: 0x6400 | nibble = 1024 + nibble and 0x6400 | nibble << 4 = 1024 + 16 nibble, so one HADD2 of
# -1032 / -1152 gives (nibble - 8) / 16 (nibble - 8) exactly, and one HMUL2 by (s, s) / (s / 16, s / 16)
# (s / 16 is exact: a power-of-two step) finishes the value. LOP3 with 0x000F000F / 0x00F000F0 takes the low /
# high nibbles of bytes 0 and 2 of a word at once (bytes 1 and 3 after one shift), so a key word of 8 codes
# costs 4 LOP3 + 1 SHF + 4 HADD2 + 4 HMUL2 (3.25 instructions per fragment register), and a value register,
# which pairs two tokens' bytes, 1 PRMT per 2 registers (both nibbles) + LOP3 + HADD2 + HMUL2 (3.5).
# K: one word -> the 4 fragment registers (lo b0, lo b2), (hi b0, hi b2), (lo b1, lo b3), (hi b1, hi b3),
# each ((n - 8) s, (n' - 8) s): outputs $0..$7 in that order; inputs $8 word, $9 s, $10 s / 16.
ASM_K = ttgl.constexpr("""{ .reg .b32 u, r0, r1, r2, r3, s1, s16, cl, ch;
mov.b32 cl, 0xE408E408;
mov.b32 ch, 0xE480E480;
mov.b32 s1, {$9, $9};
mov.b32 s16, {$10, $10};
shr.b32 u, $8, 8;
lop3.b32 r0, $8, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 r1, $8, 0x00F000F0, 0x64006400, 0xEA;
lop3.b32 r2, u, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 r3, u, 0x00F000F0, 0x64006400, 0xEA;
add.rn.f16x2 r0, r0, cl;
add.rn.f16x2 r1, r1, ch;
add.rn.f16x2 r2, r2, cl;
add.rn.f16x2 r3, r3, ch;
mul.rn.f16x2 r0, r0, s1;
mul.rn.f16x2 r1, r1, s16;
mul.rn.f16x2 r2, r2, s1;
mul.rn.f16x2 r3, r3, s16;
mov.b32 {$0, $1}, r0;
mov.b32 {$2, $3}, r1;
mov.b32 {$4, $5}, r2;
mov.b32 {$6, $7}, r3; }""")
# V: byte k of token A's and token B's words -> (lo_A, lo_B) and (hi_A, hi_B): outputs $0..$3;
# inputs $4 word A, $5 word B, $6 s_A, $7 s_B, $8 s_A / 16, $9 s_B / 16.
_ASM_V = """{ .reg .b32 t, lo, hi, s1, s16, cl, ch;
mov.b32 cl, 0xE408E408;
mov.b32 ch, 0xE480E480;
mov.b32 s1, {$6, $7};
mov.b32 s16, {$8, $9};
prmt.b32 t, $4, $5, SEL;
lop3.b32 lo, t, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 hi, t, 0x00F000F0, 0x64006400, 0xEA;
add.rn.f16x2 lo, lo, cl;
add.rn.f16x2 hi, hi, ch;
mul.rn.f16x2 lo, lo, s1;
mul.rn.f16x2 hi, hi, s16;
mov.b32 {$0, $1}, lo;
mov.b32 {$2, $3}, hi; }"""


def asm_v(k: int) -> str:
    """The V asm for byte k: prmt selector nibbles (byte 0 first) A.k, A.k, B.k, B.k put A's byte k at
    byte 0 and B's at byte 2."""
    return _ASM_V.replace("SEL", f"0x{4 + k}{4 + k}{k}{k}")


AV0, AV1, AV2, AV3 = (ttgl.constexpr(asm_v(k)) for k in range(4))


def k_channel_order(D: int = 128) -> list[int]:
    """Head-dim channel of score contraction index kappa = h2 + 2 r + 8 q + 32 wi (see module doc): register
    q of word wi holds byte (q >> 1) + 2 h2 of the word, nibble q & 1."""
    out = []
    for kappa in range(D):
        h2, r, q, wi = kappa & 1, (kappa >> 1) & 3, (kappa >> 3) & 3, kappa >> 5
        out.append(32 * r + 4 * wi + (q >> 1) + 2 * h2 + 16 * (q & 1))
    return out


def v_channel_order(D: int = 128) -> list[int]:
    """Head-dim channel of output column n (see module doc)."""
    out = []
    for n in range(D):
        g, h, k, we = n & 7, (n >> 3) & 1, (n >> 4) & 3, n >> 6
        j = 8 * g + 4 * we + k
        out.append(32 * (j // 16) + j % 16 + 16 * h)
    return out


@functools.lru_cache(maxsize=8)
def channel_orders(device) -> tuple[torch.Tensor, torch.Tensor]:
    """(k_channel_order, v_channel_order) as int32 tensors on `device` (the kernel's KPERM / VPERM)."""
    return (torch.tensor(k_channel_order(), dtype=torch.int32, device=device),
            torch.tensor(v_channel_order(), dtype=torch.int32, device=device))


@functools.lru_cache(maxsize=16)
def layouts(NW: int, TW: int = 16) -> dict:
    """Register layouts (constexpr) for NW warps of TW tokens each: MMA accumulator, dot operands, code words."""
    if TW not in (16, 32):
        raise ValueError(f"tokens per warp must be 16 or 32, got {TW}")
    mma = ttgl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[NW, 1, 1], instr_shape=[1, 16, 8])
    warps = [[1 << i] + [0] * 3 for i in range(NW.bit_length() - 1)]
    hi_tok = [[0, 0, 0, 16]] if TW == 32 else []  # token bit 4 in registers
    # K words [NW, wi 4, r 4, TW]: wi in registers, r = lane % 4, token = lane // 4 (+ 8, + 16 in registers)
    kw = ttgl.DistributedLinearLayout(
        reg_bases=[[0, 1, 0, 0], [0, 2, 0, 0], [0, 0, 0, 8]] + hi_tok,
        lane_bases=[[0, 0, 1, 0], [0, 0, 2, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 4]],
        warp_bases=warps, block_bases=[], shape=[NW, 4, 4, TW])
    # V words [NW, we 2, g 8, TW]: we and token bits 0, 3 (, 4) in registers, token bits 1-2 = lane % 4, g = lane // 4
    vw = ttgl.DistributedLinearLayout(
        reg_bases=[[0, 1, 0, 0], [0, 0, 0, 1], [0, 0, 0, 8]] + hi_tok,
        lane_bases=[[0, 0, 0, 2], [0, 0, 0, 4], [0, 0, 1, 0], [0, 0, 2, 0], [0, 0, 4, 0]],
        warp_bases=warps, block_bases=[], shape=[NW, 2, 8, TW])
    # V words of the first / second token of each fragment pair [NW, we 2, g 8, c TW/2] (c = token pair)
    vwa = ttgl.DistributedLinearLayout(
        reg_bases=[[0, 1, 0, 0], [0, 0, 0, 4]] + ([[0, 0, 0, 8]] if TW == 32 else []),
        lane_bases=[[0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 1, 0], [0, 0, 2, 0], [0, 0, 4, 0]],
        warp_bases=warps, block_bases=[], shape=[NW, 2, 8, TW // 2])
    return dict(VWA=vwa, MMA=mma, A=ttgl.DotOperandLayout(operand_index=0, parent=mma, k_width=2),
                B=ttgl.DotOperandLayout(operand_index=1, parent=mma, k_width=2), KW=kw, VW=vw)


@gluon.jit
def _k_word(w, s, s16):
    return ttgl.inline_asm_elementwise(ASM_K, "=h,=h,=h,=h,=h,=h,=h,=h,r,h,h", [w, s, s16],
                                       dtype=(ttgl.float16,) * 8, is_pure=True, pack=1)


@gluon.jit
def _v_byte(wa, wb, sa, sb, sa16, sb16, ASM: ttgl.constexpr):
    return ttgl.inline_asm_elementwise(ASM, "=h,=h,=h,=h,r,r,h,h,h,h", [wa, wb, sa, sb, sa16, sb16],
                                       dtype=(ttgl.float16,) * 4, is_pure=True, pack=1)


@gluon.jit
def _jk(o):
    """(lo A, lo B, hi A, hi B) -> [..., t0, h]."""
    return ttgl.join(ttgl.join(o[0], o[1]), ttgl.join(o[2], o[3]))


@gluon.jit
def _tok_rows(IDX, t0, hi, hk, c0, c1, ROW: ttgl.constexpr, P: ttgl.constexpr, TW: ttgl.constexpr,
              N: ttgl.constexpr, STEP: ttgl.constexpr, L2: ttgl.constexpr, NW: ttgl.constexpr):
    """[NW, N] (layout L2) int64 offsets of the rows of tokens t0 + w * TW + STEP * n in a page tensor with
    strides c0 (page), c1 (head) and ROW (row; pages are dense within a (page, head) tile). t0 % TW == 0 and
    P % 16 == 0, so a warp's tokens lie in at most two pages, looked up once per warp. A page past `hi` reads
    as page 0 (those scores are masked, those V scales zeroed)."""
    tb = t0 + ttgl.arange(0, NW, layout=ttgl.SliceLayout(1, L2)) * TW  # [NW] first token of each warp
    n = ttgl.arange(0, N, layout=ttgl.SliceLayout(0, L2)) * STEP
    r0 = tb % P  # row of the warp's first token in its page
    base = ttgl.load(IDX + tb // P, mask=tb < hi, other=0).to(ttgl.int64) * c0 + hk * c1 + r0 * ROW
    if P % TW == 0:  # one page per warp and tile
        return base[:, None] + (n * ROW)[None, :]
    else:  # e.g. P = 16, TW = 32: tokens from row P - r0 on are rows 0.. of the next page
        nxt = (tb // P + 1) * P
        base1 = ttgl.load(IDX + tb // P + 1, mask=nxt < hi, other=0).to(ttgl.int64) * c0 + hk * c1 + (r0 - P) * ROW
        return ttgl.where((r0[:, None] + n[None, :]) < P, base[:, None], base1[:, None]) + (n * ROW)[None, :]


@gluon.jit
def _k_load(KC, KS, IDX, t0, hi, hk, kc0, kc1, kc2, ks0, ks1, ks2, P: ttgl.constexpr, TW: ttgl.constexpr,
            KW: ttgl.constexpr, NW: ttgl.constexpr):
    """Raw K codes (int32 words [NW, wi, r, TW]) and scales ([NW, r, TW] fp16) of tokens t0 + w * TW + [0, TW)
    of warp w, read unmasked (rows past `hi` read page 0 or unused rows; the caller scores them -inf)."""
    L3: ttgl.constexpr = ttgl.SliceLayout(3, KW)
    wi = ttgl.arange(0, 4, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(2, L3)))
    r = ttgl.arange(0, 4, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(1, L3)))
    word = (4 * r[None, None, :] + wi[None, :, None])[:, :, :, None]  # [1, wi, r, 1]
    rows = _tok_rows(IDX, t0, hi, hk, kc0, kc1, 16, P, TW, TW, 1, ttgl.SliceLayout(1, ttgl.SliceLayout(2, KW)), NW)
    w = ttgl.load(KC + rows[:, None, None, :] + word)
    LS: ttgl.constexpr = ttgl.SliceLayout(1, KW)
    rs = ttgl.arange(0, 4, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(2, LS)))
    srows = _tok_rows(IDX, t0, hi, hk, ks0, ks1, 4, P, TW, TW, 1, ttgl.SliceLayout(1, LS), NW)
    s = ttgl.load(KS + srows[:, None, :] + rs[None, :, None])
    return w, s


@gluon.jit
def _k_build(w, s, B: ttgl.constexpr, NW: ttgl.constexpr, TW: ttgl.constexpr):
    """K^T fragment [NW, 128, TW] fp16, contraction in kappa order, from `_k_load`'s words and scales."""
    s = ttgl.expand_dims(s, 1)
    s16 = ttgl.broadcast(s * 0.0625, w)[0]
    s = ttgl.broadcast(s, w)[0]
    o = _k_word(w, s, s16)  # 8 values per word: registers q = 0..3, two halves h2 each
    j = ttgl.join(ttgl.join(ttgl.join(o[0], o[1]), ttgl.join(o[2], o[3])),
                  ttgl.join(ttgl.join(o[4], o[5]), ttgl.join(o[6], o[7])))  # [NW, wi, r, TW, h2, q0, q1]
    j = ttgl.permute(j, [0, 1, 6, 5, 2, 4, 3])  # [NW, wi, q1, q0, r, h2, TW]
    return ttgl.convert_layout(ttgl.reshape(j, [NW, 128, TW]), B, assert_trivial=True)


@gluon.jit
def _v_load(VC, VS, IDX, t0, hi, hk, vc0, vc1, vc2, vs0, vs1, vs2, P: ttgl.constexpr, TW: ttgl.constexpr,
            VW: ttgl.constexpr, VWA: ttgl.constexpr, NW: ttgl.constexpr):
    """Raw V codes of tokens t0 + w * TW + [0, TW) of warp w as the words of the first and second token of each
    fragment pair ([NW, we, g, c] int32) and their scales ([NW, g, c] fp16; 0 past `hi`, so those rows are 0)."""
    L3: ttgl.constexpr = ttgl.SliceLayout(3, VW)
    we = ttgl.arange(0, 2, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(2, L3)))
    g = ttgl.arange(0, 8, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(1, L3)))
    word = (2 * g[None, None, :] + we[None, :, None])[:, :, :, None]  # [1, we, g, 1]
    rows = _tok_rows(IDX, t0, hi, hk, vc0, vc1, 16, P, TW, TW, 1, ttgl.SliceLayout(1, ttgl.SliceLayout(2, VW)), NW)
    w = ttgl.load(VC + rows[:, None, None, :] + word)  # [NW, we, g, TW]
    wa, wb = ttgl.split(ttgl.reshape(w, [NW, 2, 8, TW // 2, 2]))  # tokens 2c, 2c + 1: [NW, we, g, c]
    wa = ttgl.convert_layout(wa, VWA, assert_trivial=True)
    wb = ttgl.convert_layout(wb, VWA, assert_trivial=True)
    # scales of tokens 2c and 2c + 1 (one page: P is even) for the block of bytes 8g .. 8g + 7 (block g // 2)
    S3: ttgl.constexpr = ttgl.SliceLayout(1, VWA)  # [NW, g, c]
    sg = ttgl.arange(0, 8, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(2, S3)))
    L2: ttgl.constexpr = ttgl.SliceLayout(1, S3)  # [NW, c]
    srow = _tok_rows(IDX, t0, hi, hk, vs0, vs1, 4, P, TW, TW // 2, 2, L2, NW)  # first token of each pair
    tw = ttgl.arange(0, NW, layout=ttgl.SliceLayout(1, L2))
    tc = ttgl.arange(0, TW // 2, layout=ttgl.SliceLayout(0, L2))
    ta = (t0 + tw * TW)[:, None] + 2 * tc[None, :]  # [NW, c] first token of the pair
    off = srow[:, None, :] + (sg // 2)[None, :, None]
    sa = ttgl.load(VS + off, mask=(ta < hi)[:, None, :], other=0.0)
    sb = ttgl.load(VS + off + 4, mask=(ta + 1 < hi)[:, None, :], other=0.0)
    return wa, wb, sa, sb


@gluon.jit
def _v_build(wa, wb, sa, sb, B: ttgl.constexpr, NW: ttgl.constexpr, TW: ttgl.constexpr):
    """V fragment [NW, TW, 128] fp16 (columns in v_channel_order) from `_v_load`'s words and scales."""
    sa = ttgl.expand_dims(sa, 1)
    sb = ttgl.expand_dims(sb, 1)
    sa16 = ttgl.broadcast(sa * 0.0625, wa)[0]
    sb16 = ttgl.broadcast(sb * 0.0625, wa)[0]
    sa = ttgl.broadcast(sa, wa)[0]
    sb = ttgl.broadcast(sb, wa)[0]
    b0 = _v_byte(wa, wb, sa, sb, sa16, sb16, AV0)  # (lo A, lo B, hi A, hi B) of byte k = 0 of each word
    b1 = _v_byte(wa, wb, sa, sb, sa16, sb16, AV1)
    b2 = _v_byte(wa, wb, sa, sb, sa16, sb16, AV2)
    b3 = _v_byte(wa, wb, sa, sb, sa16, sb16, AV3)
    j = ttgl.join(ttgl.join(_jk(b0), _jk(b1)), ttgl.join(_jk(b2), _jk(b3)))  # [NW, we, g, c, t0, h, k0, k1]
    j = ttgl.permute(j, [0, 3, 4, 1, 7, 6, 5, 2])  # [NW, c, t0, we, k1, k0, h, g]
    return ttgl.convert_layout(ttgl.reshape(j, [NW, TW, 128]), B, assert_trivial=True)


@gluon.jit
def _decode_q4_kernel(Q, OUT, OP, LSE, KC, KS, VC, VS, KPERM, VPERM, INDPTR, INDICES, LAST, qk_scale, num_splits,
                      sq0, sq1, so0, so1, kc0, kc1, kc2, ks0, ks1, ks2, vc0, vc1, vc2, vs0, vs1, vs2,
                      GROUP: ttgl.constexpr, P: ttgl.constexpr, NW: ttgl.constexpr, TW: ttgl.constexpr,
                      DIRECT: ttgl.constexpr,
                      MMA: ttgl.constexpr, A: ttgl.constexpr, B: ttgl.constexpr, KW: ttgl.constexpr,
                      VW: ttgl.constexpr, VWA: ttgl.constexpr):
    """q [B, Hq, 128]; K/V codes as int32 words [N, Hk, P, 16] and fp16 scales [N, Hk, P, 4]; strides in
    elements of those views. Writes OUT [B, Hq, 128] (DIRECT) or OP [B, Hq, S, 128] + LSE [B, Hq, S] (log2)."""
    b = ttgl.program_id(0)
    hk = ttgl.program_id(1)
    sp = ttgl.program_id(2)
    BN: ttgl.constexpr = NW * TW
    p0 = ttgl.load(INDPTR + b)
    p1 = ttgl.load(INDPTR + b + 1)
    L = ttgl.where(p1 > p0, (p1 - p0 - 1) * P + ttgl.load(LAST + b), 0)
    per = ttgl.cdiv(ttgl.cdiv(L, num_splits), BN) * BN  # tokens per split, whole tiles
    lo = sp * per
    hi = ttgl.minimum(lo + per, L)
    IDX = INDICES + p0

    # queries [NW (same for every warp), GP, 128] in kappa order, scaled by qk_scale (log2 domain)
    qz = ttgl.arange(0, NW, layout=ttgl.SliceLayout(1, ttgl.SliceLayout(2, A)))
    qg = ttgl.arange(0, GP, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(2, A)))
    kap = ttgl.arange(0, 128, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(1, A)))
    qch = ttgl.load(KPERM + kap)  # head-dim channel of contraction index kappa (k_channel_order)
    qrow = qz[:, None, None] * 0 + qg[None, :, None]
    qm = (qrow < GROUP) & (qch[None, None, :] < 128)
    q = ttgl.load(Q + b * sq0 + (hk * GROUP + qrow) * sq1 + qch[None, None, :], mask=qm, other=0.0)
    q = (q.to(ttgl.float32) * qk_scale).to(ttgl.float16)

    # token index helpers: score tile [NW, GP, TW] and the word / scale tiles of K and V
    SL: ttgl.constexpr = ttgl.SliceLayout(1, MMA)
    sw = ttgl.arange(0, NW, layout=ttgl.SliceLayout(1, SL))
    sn = ttgl.arange(0, TW, layout=ttgl.SliceLayout(0, SL))
    s_tok = (sw * TW)[:, None] + sn[None, :]  # [NW, TW] offset of each score column in the tile

    m_i = ttgl.full([NW, GP], float("-inf"), ttgl.float32, layout=ttgl.SliceLayout(2, MMA))
    l_i = ttgl.zeros([NW, GP], ttgl.float32, layout=ttgl.SliceLayout(2, MMA))
    acc = ttgl.zeros([NW, GP, 128], ttgl.float32, layout=MMA)
    kw, ks = _k_load(KC, KS, IDX, lo, hi, hk, kc0, kc1, kc2, ks0, ks1, ks2, P, TW, KW, NW)
    va, vb, vsa, vsb = _v_load(VC, VS, IDX, lo, hi, hk, vc0, vc1, vc2, vs0, vs1, vs2, P, TW, VW, VWA, NW)
    for t0 in range(lo, hi, BN):
        # the next tile's codes are requested before this tile's math (software prefetch into registers)
        nkw, nks = _k_load(KC, KS, IDX, t0 + BN, hi, hk, kc0, kc1, kc2, ks0, ks1, ks2, P, TW, KW, NW)
        nva, nvb, nvsa, nvsb = _v_load(VC, VS, IDX, t0 + BN, hi, hk, vc0, vc1, vc2, vs0, vs1, vs2, P, TW, VW, VWA, NW)
        kt = _k_build(kw, ks, B, NW, TW)
        s = mma_v2(q, kt, ttgl.zeros([NW, GP, TW], ttgl.float32, layout=MMA))
        valid = (t0 + s_tok) < hi
        s = ttgl.where(valid[:, None, :], s, float("-inf"))
        m_new = ttgl.maximum(m_i, ttgl.max(s, 2))
        m_safe = ttgl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = ttgl.exp2(m_i - m_safe)
        p = ttgl.exp2(s - m_safe[:, :, None])
        l_i = l_i * alpha + ttgl.sum(p, 2)
        m_i = m_new
        vt = _v_build(va, vb, vsa, vsb, B, NW, TW)
        pa = ttgl.convert_layout(p.to(ttgl.float16), A, assert_trivial=True)
        acc = mma_v2(pa, vt, acc * alpha[:, :, None])
        kw, ks, va, vb, vsa, vsb = nkw, nks, nva, nvb, nvsa, nvsb

    # merge the warps' softmax states
    m_all = ttgl.max(m_i, 0)  # [GP]
    m_all_safe = ttgl.where(m_all == float("-inf"), 0.0, m_all)
    wgt = ttgl.exp2(m_i - m_all_safe[None, :])  # [NW, GP]
    l_all = ttgl.sum(l_i * wgt, 0)  # [GP]
    inv = ttgl.where(l_all > 0, 1.0 / ttgl.where(l_all > 0, l_all, 1.0), 0.0)  # rows with no token -> 0
    o = ttgl.sum(acc * (wgt * inv[None, :])[:, :, None], 0)  # [GP, 128]
    OL: ttgl.constexpr = ttgl.SliceLayout(0, MMA)
    og = ttgl.arange(0, GP, layout=ttgl.SliceLayout(1, OL))
    on = ttgl.arange(0, 128, layout=ttgl.SliceLayout(0, OL))
    och = ttgl.load(VPERM + on)  # head-dim channel of output column n (v_channel_order)
    heads = hk * GROUP + og
    om = (og < GROUP)[:, None] & (och < 128)[None, :]
    if DIRECT:
        ttgl.store(OUT + b * so0 + heads[:, None] * so1 + och[None, :], o.to(OUT.dtype.element_ty), mask=om)
    else:
        row = (b * ttgl.num_programs(1) * GROUP + heads) * num_splits + sp
        ttgl.store(OP + row[:, None] * 128 + och[None, :], o, mask=om)
        lse = ttgl.where(l_all > 0, m_all + ttgl.log2(ttgl.where(l_all > 0, l_all, 1.0)), float("-inf"))
        lg = ttgl.arange(0, GP, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(2, MMA)))
        lrow = (b * ttgl.num_programs(1) * GROUP + hk * GROUP + lg) * num_splits + sp
        ttgl.store(LSE + lrow, lse, mask=lg < GROUP)


# ---- host side ------------------------------------------------------------------------------------
def _is_q4_0(spec) -> bool:
    return (spec.fmt == "int" and spec.bits == 4 and spec.sym and spec.axis == "tok" and spec.pack == "ggml"
            and spec.group == 32 and spec.scale_dtype == "f16" and spec.has_scale and not spec.tensor_scale
            and spec.rotation != "had" and not spec.pre_rope)


def why_not(k_spec, v_spec, D: int, P: int, group: int, has_fp: bool, device) -> str | None:
    """None when the Gluon q4 kernel runs this call; else the reason it does not."""
    if not (_is_q4_0(k_spec) and _is_q4_0(v_spec)):
        return "K and V must both be q4_0-layout int4 (sym, group 32, GGML packing, fp16 scales, no rotation)"
    if D != 128:
        return f"head_dim must be 128, got {D}"
    if P % PAGE_UNIT:
        return f"page size must be a multiple of {PAGE_UNIT}, got {P}"
    if group > GP.value:
        return f"GQA group must be <= {GP.value}, got {group}"
    if has_fp:
        return "full-precision window / sink tokens are not handled (use the Triton kernel)"
    dev = torch.device(device)
    if dev.type != "cuda" or torch.cuda.get_device_capability(dev)[0] < 8:
        return "needs a CUDA GPU with mma.sync (sm_80+)"
    return None


def decode_gluon(q, k_pages, v_pages, kv_indptr, kv_indices, kv_last_page_len, P, *, sm_scale, num_splits,
                 num_warps=4, tokens_per_warp=16, out=None, plan=False):
    """Split-K q4_0 decode; same contract as `decode_triton` for the calls `why_not` accepts."""
    from .triton import _merge_kernel
    B, Hq, D = q.shape
    Hk = k_pages["codes"].shape[1]
    group = Hq // Hk
    NW = int(num_warps)
    if NW not in (1, 2, 4, 8):
        raise ValueError(f"gluon q4 decode: num_warps must be 1, 2, 4 or 8, got {NW}")
    S = int(num_splits)
    kc, vc = k_pages["codes"].view(torch.int32), v_pages["codes"].view(torch.int32)
    ks, vs = k_pages["scales"], v_pages["scales"]
    for name, t in (("K codes", kc), ("V codes", vc), ("K scales", ks), ("V scales", vs)):
        if t.stride(-1) != 1 or t.stride(-2) != t.shape[-1]:
            raise ValueError(f"{name} must be contiguous within a (page, head) tile; got strides {t.stride()}")
    TW = int(tokens_per_warp)
    lay = layouts(NW, TW)
    if out is None:
        out = torch.empty((B, Hq, D), dtype=q.dtype, device=q.device)
    op = lse = out
    if S > 1:
        op = torch.empty((B, Hq, S, D), dtype=torch.float32, device=q.device)
        lse = torch.empty((B, Hq, S), dtype=torch.float32, device=q.device)

    def launch():
        _decode_q4_kernel[(B, Hk, S)](
            q, out, op, lse, kc, ks, vc, vs, *channel_orders(q.device), kv_indptr, kv_indices, kv_last_page_len,
            sm_scale * 1.4426950408889634, S, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
            *kc.stride()[:3], *ks.stride()[:3], *vc.stride()[:3], *vs.stride()[:3],
            GROUP=group, P=P, NW=NW, TW=TW, DIRECT=S == 1, MMA=lay["MMA"], A=lay["A"], B=lay["B"], KW=lay["KW"],
            VW=lay["VW"], VWA=lay["VWA"], num_warps=NW)
        if S > 1:
            _merge_kernel[(B, Hq)](op, lse, out, S, out.stride(0), out.stride(1), SP=triton.next_power_of_2(S), D=D,
                                   num_warps=4)
        return out

    return launch if plan else launch()
