"""Code formats of the Gluon MMA-fragment decode (gluon_mma.py): loads and fragment builders per codec.

A codec turns a page's code words into fp16 `mma.sync.m16n8k16` B-operand fragments in registers:
- Q4 (0): int4 sym group 32, fp16 scales (q4_0; GGML or sequential nibbles): v = (nibble - 8) s.
- I8 (1): q8_0 / int8 sym group 32, fp16 scales, two's-complement bytes: v = byte s.
- F8 (2): fp8_e4m3 bytes (optionally one per-tensor scale, applied by the kernel): v = e4m3(byte).
- Q4A (3): int4 asym group 32, fp16 scales and zeros (q4_1, int4:g32:asym, int4_had): v = nibble s + m.
- I8A (4): int8 asym, fp16 scales and zeros: v = byte s + m (byte unsigned).
Groups of 32, 64 or 128 channels (one fp16 scale, and zero, per group): a thread's D / 4 key channels
and D / 8 value channels always lie in one group (head dims D 64 and 128; 256 with groups of 64 or more).
`words_k` / `words_v` give the code words a thread reads per row at head dim D.
The nibble order within a byte (GGML: element i and i + 16 of a group; sequential: 2i and 2i + 1)
only changes which channel each fragment element is, i.e. the channel orders below, not the kernel.
A Hadamard rotation is applied outside the kernel (q rotated, the output rotated back).

Keys (scores = q K^T, contraction over the head dim): a thread with lane % 4 = r owns the 32 channels
of block r for its tokens, so it reads one contiguous run per row (16 bytes for Q4, 32 for I8 / F8)
and needs one scale. The order of the contraction (kappa) is free as long as q is gathered in the
same order: `k_channel_order(codec)` is the channel of each kappa.
Values (out = p V, contraction over tokens): a thread with lane // 4 = g owns 16 output columns and
reads 8 (Q4) or 16 (I8 / F8) contiguous bytes of four token rows; a fragment register pairs two
tokens, so one PRMT picks byte k of both rows. `v_channel_order(codec)` is the channel of each
output column.

fp16 magic numbers: 0x6400 | x is 1024 + x for x < 1024, so nibble / byte codes become exact fp16
integers with one LOP3, one HADD2 removes the offset exactly, and one HMUL2 applies the scale
(for a high nibble, 0x6400 | n << 4 = 1024 + 16 n and the scale comes in divided by 16: exact for
|s| >= 2^-10; below that s / 16 is an fp16 subnormal and the value can differ from the oracle's by
one rounding of s / 16, at most 8 * 2^-20 in absolute terms. The test pins both cases).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as ttgl

Q4, I8, F8, Q4A, I8A = 0, 1, 2, 3, 4
C_Q4, C_I8, C_F8, C_Q4A, C_I8A = (ttgl.constexpr(c) for c in (Q4, I8, F8, Q4A, I8A))  # the same, for jit code
CODECS = {Q4: "int4 sym (q4_0)", Q4A: "int4 asym (q4_1, int4:g32:asym)", I8: "int8 sym (q8_0)", I8A: "int8 asym",
          F8: "fp8_e4m3 (no group scales)"}
GROUPS = (32, 64, 128)  # int codecs: token-axis groups with fp16 scales (and zeros)
WORDS_K = {Q4: 4, I8: 8, F8: 8, Q4A: 4, I8A: 8}   # 32-bit code words per thread per key row at D 128 (32 channels)
WORDS_V = {Q4: 2, I8: 4, F8: 4, Q4A: 2, I8A: 4}   # ... per value row (16 output columns)
HEAD_DIMS = (64, 128, 256)


def words_k(codec: int, D: int = 128) -> int:
    """Code words per thread per key row at head dim D (a thread holds D / 4 channels)."""
    return WORDS_K[codec] * D // 128


def words_v(codec: int, D: int = 128) -> int:
    """Code words per thread per value row at head dim D (a thread holds D / 8 output columns)."""
    return WORDS_V[codec] * D // 128


def codec_of(spec) -> int | None:
    """The codec that decodes `spec`'s pages, or None."""
    if spec.pre_rope or spec.tensor_scale or spec.twos or spec.rotation not in ("none", "had"):
        return None  # (two's-complement sub-byte codes: FreeToken; the codecs read offset binary)
    if spec.fmt == "int" and spec.axis == "tok" and spec.group in GROUPS and spec.scale_dtype == "f16":
        if spec.bits == 4 and spec.pack in ("ggml", "seq"):
            return Q4 if spec.sym else Q4A
        if spec.bits == 8:
            return I8 if spec.sym else I8A
    if spec.fmt == "fp8_e4m3" and spec.axis == "tensor":
        return F8
    return None


def _nibble_channel(j: int, h: int, pack: str, G: int = 32) -> int:
    """Channel of nibble h of byte j of an int4 row: GGML holds elements i and i + G / 2 of each
    G-group in byte G / 2 * g + i, sequential packing elements 2j and 2j + 1."""
    half = G // 2
    return G * (j // half) + j % half + half * h if pack == "ggml" else 2 * j + h


def k_channel_order(codec: int = Q4, pack: str = "ggml", G: int = 32, D: int = 128) -> list[int]:
    """Head-dim channel of each score contraction index kappa = h2 + 2 r + 8 x (x = the thread's register);
    thread r reads the 4 WK bytes of its row from byte 4 WK r on (WK = words_k(codec, D))."""
    out, rb = [], 4 * words_k(codec, D)
    for kap in range(D):
        h2, r, x = kap & 1, (kap >> 1) & 3, kap >> 3
        if codec in (Q4, Q4A):  # register x = q + 4 wi holds byte (q >> 1) + 2 h2 of word wi, nibble q & 1
            q, wi = x & 3, x >> 2
            out.append(_nibble_channel(rb * r + 4 * wi + (q >> 1) + 2 * h2, q & 1, pack, G))
        elif codec in (I8, I8A):  # register x = q + 2 wi holds bytes (q, q + 2) of word wi
            q, wi = x & 1, x >> 1
            out.append(rb * r + 4 * wi + q + 2 * h2)
        else:  # F8: register x = q + 2 wi holds bytes (2 q, 2 q + 1) of word wi
            q, wi = x & 1, x >> 1
            out.append(rb * r + 4 * wi + 2 * q + h2)
    return out


def v_channel_order(codec: int = Q4, pack: str = "ggml", G: int = 32, D: int = 128) -> list[int]:
    """Head-dim channel of each output column n = g + 8 nt; thread g reads the 4 WV bytes of a row from byte
    4 WV g on (WV = words_v(codec, D))."""
    out, gb = [], 4 * words_v(codec, D)
    for n in range(D):
        g, nt = n & 7, n >> 3
        if codec in (Q4, Q4A):  # nt = h + 2 k + 8 we: nibble h of byte k of word we of the thread's bytes
            h, k, we = nt & 1, (nt >> 1) & 3, nt >> 3
            out.append(_nibble_channel(gb * g + 4 * we + k, h, pack, G))
        else:  # nt = k + 4 we: byte k of word we of the thread's bytes
            k, we = nt & 3, nt >> 2
            out.append(gb * g + 4 * we + k)
    return out


# ---- inline PTX (outputs first; the emulator in kvlab.kernels.gluon_emu runs these strings) ----------
def _int4_head(asym: bool, regs: str, s_ops: str, s16_ops: str, m_ops: str) -> tuple[list[str], str]:
    """Register declarations and constants shared by the int4 asm: offsets to subtract from the magic
    (sym: 1032 / 1152 for low / high nibbles; asym: 1024 both) and the finishing op (HMUL2 by the scale,
    or HFMA2 by scale and zero) as a format string over {r} (register) and {s} (scale register)."""
    lo_c, hi_c = ("0xE400E400", "0xE400E400") if asym else ("0xE408E408", "0xE480E480")
    head = [f"{{ .reg .b32 {regs}, s1, s16, cl, ch, m1;", f"mov.b32 cl, {lo_c};", f"mov.b32 ch, {hi_c};",
            f"mov.b32 s1, {{{s_ops}}};", f"mov.b32 s16, {{{s16_ops}}};"] + ([f"mov.b32 m1, {{{m_ops}}};"] if asym else [])
    return head, ("fma.rn.f16x2 {r}, {r}, {s}, m1;" if asym else "mul.rn.f16x2 {r}, {r}, {s};")


def _asm_k4(asym: bool) -> str:
    """Int4 keys: word -> registers (lo b0, lo b2), (hi b0, hi b2), (lo b1, lo b3), (hi b1, hi b3).
    Sym: outputs $0..$7, in $8 w, $9 s, $10 s/16; (x - 1032 | 1152) * s. Asym: in also $11 m;
    (x - 1024) * s + m (one HFMA2; the high nibbles come in as 16 n and meet s / 16)."""
    head, fin = _int4_head(asym, "u, r0, r1, r2, r3", "$9, $9", "$10, $10", "$11, $11")
    lines = head + [
        "shr.b32 u, $8, 8;",
        "lop3.b32 r0, $8, 0x000F000F, 0x64006400, 0xEA;", "lop3.b32 r1, $8, 0x00F000F0, 0x64006400, 0xEA;",
        "lop3.b32 r2, u, 0x000F000F, 0x64006400, 0xEA;", "lop3.b32 r3, u, 0x00F000F0, 0x64006400, 0xEA;",
        "add.rn.f16x2 r0, r0, cl;", "add.rn.f16x2 r1, r1, ch;", "add.rn.f16x2 r2, r2, cl;", "add.rn.f16x2 r3, r3, ch;",
        fin.format(r="r0", s="s1"), fin.format(r="r1", s="s16"), fin.format(r="r2", s="s1"),
        fin.format(r="r3", s="s16"),
        "mov.b32 {$0, $1}, r0;", "mov.b32 {$2, $3}, r1;", "mov.b32 {$4, $5}, r2;", "mov.b32 {$6, $7}, r3; }"]
    return "\n".join(lines)


ASM_K_Q4 = ttgl.constexpr(_asm_k4(False))
ASM_K_Q4A = ttgl.constexpr(_asm_k4(True))
def _asm_k8(asym: bool) -> str:
    """Int8 keys: word -> registers (b0, b2), (b1, b3). Sym: (x & 0x00FF00FF) ^ 0x64806480 = 0x6400 | (x ^ 0x80)
    per half (lop3 0x6A = (a & b) ^ c), minus 1152 = the signed byte, times s; in $4 w, $5 s. Asym:
    (x & 0x00FF00FF) | 0x64006400 = 1024 + byte (lop3 0xEA), minus 1024, then byte s + m (one HFMA2); in also $6 m."""
    magic, lut, c = ("0x64006400", "0xEA", "0xE400E400") if asym else ("0x64806480", "0x6A", "0xE480E480")
    fin = "fma.rn.f16x2 {r}, {r}, s1, m1;" if asym else "mul.rn.f16x2 {r}, {r}, s1;"
    lines = ["{ .reg .b32 u, r0, r1, s1, m1, c;", f"mov.b32 c, {c};", "mov.b32 s1, {$5, $5};"] + (
        ["mov.b32 m1, {$6, $6};"] if asym else []) + [
        "shr.b32 u, $4, 8;",
        f"lop3.b32 r0, $4, 0x00FF00FF, {magic}, {lut};", f"lop3.b32 r1, u, 0x00FF00FF, {magic}, {lut};",
        "add.rn.f16x2 r0, r0, c;", "add.rn.f16x2 r1, r1, c;", fin.format(r="r0"), fin.format(r="r1"),
        "mov.b32 {$0, $1}, r0;", "mov.b32 {$2, $3}, r1; }"]
    return "\n".join(lines)


ASM_K_I8 = ttgl.constexpr(_asm_k8(False))
ASM_K_I8A = ttgl.constexpr(_asm_k8(True))
# F8 keys: word -> registers (b0, b1), (b2, b3) by the hardware e4m3x2 -> f16x2 conversion (sm_89+). In: $4 w.
ASM_K_F8 = ttgl.constexpr("""{ .reg .b16 l, h; .reg .b32 r0, r1;
mov.b32 {l, h}, $4;
cvt.rn.f16x2.e4m3x2 r0, l;
cvt.rn.f16x2.e4m3x2 r1, h;
mov.b32 {$0, $1}, r0;
mov.b32 {$2, $3}, r1; }""")


def _asm_v4(asym: bool) -> str:
    """Int4 values, byte k of words A and B -> (lo A, lo B, hi A, hi B). In: $4 wA, $5 wB, $6 sA, $7 sB,
    $8 sA/16, $9 sB/16 (asym: $10 mA, $11 mB)."""
    head, fin = _int4_head(asym, "t, lo, hi", "$6, $7", "$8, $9", "$10, $11")
    lines = head + [
        "prmt.b32 t, $4, $5, SEL;",
        "lop3.b32 lo, t, 0x000F000F, 0x64006400, 0xEA;", "lop3.b32 hi, t, 0x00F000F0, 0x64006400, 0xEA;",
        "add.rn.f16x2 lo, lo, cl;", "add.rn.f16x2 hi, hi, ch;",
        fin.format(r="lo", s="s1"), fin.format(r="hi", s="s16"),
        "mov.b32 {$0, $1}, lo;", "mov.b32 {$2, $3}, hi; }"]
    return "\n".join(lines)


def _asm_v8(asym: bool) -> str:
    """Int8 values, byte k of words A and B -> (A, B), the key's conversion per lane. In: $2 wA, $3 wB, $4 sA,
    $5 sB (asym: $6 mA, $7 mB)."""
    magic, lut, c = ("0x64006400", "0xEA", "0xE400E400") if asym else ("0x64806480", "0x6A", "0xE480E480")
    lines = ["{ .reg .b32 t, s1, m1, c;", f"mov.b32 c, {c};", "mov.b32 s1, {$4, $5};"] + (
        ["mov.b32 m1, {$6, $7};"] if asym else []) + [
        "prmt.b32 t, $2, $3, SEL;", f"lop3.b32 t, t, 0x00FF00FF, {magic}, {lut};", "add.rn.f16x2 t, t, c;",
        "fma.rn.f16x2 t, t, s1, m1;" if asym else "mul.rn.f16x2 t, t, s1;", "mov.b32 {$0, $1}, t; }"]
    return "\n".join(lines)


# F8 values, byte k of words A and B -> (A, B). In: $2 wA, $3 wB.
_ASM_V_F8 = """{ .reg .b16 l, h; .reg .b32 t, r;
prmt.b32 t, $2, $3, SEL;
mov.b32 {l, h}, t;
cvt.rn.f16x2.e4m3x2 r, l;
mov.b32 {$0, $1}, r; }"""


def asm_v(codec: int, k: int) -> str:
    """The value asm for byte k. PRMT selector nibbles, byte 0 first: int4 / I8 put A's byte k at bytes 0-1
    and B's at 2-3 (two fp16 lanes); F8 packs A's and B's byte k into the low 16 bits (one e4m3x2)."""
    if codec == F8:
        return _ASM_V_F8.replace("SEL", f"0x00{4 + k}{k}")
    text = {Q4: _asm_v4(False), Q4A: _asm_v4(True), I8: _asm_v8(False), I8A: _asm_v8(True)}[codec]
    return text.replace("SEL", f"0x{4 + k}{4 + k}{k}{k}")


AVQ0, AVQ1, AVQ2, AVQ3 = (ttgl.constexpr(asm_v(Q4, k)) for k in range(4))
AVA0, AVA1, AVA2, AVA3 = (ttgl.constexpr(asm_v(Q4A, k)) for k in range(4))
AVB0, AVB1, AVB2, AVB3 = (ttgl.constexpr(asm_v(I8A, k)) for k in range(4))
AVI0, AVI1, AVI2, AVI3 = (ttgl.constexpr(asm_v(I8, k)) for k in range(4))
AVF0, AVF1, AVF2, AVF3 = (ttgl.constexpr(asm_v(F8, k)) for k in range(4))


# ---- loads ---------------------------------------------------------------------------------------------
@gluon.jit
def tok_rows(IDX, t0, hi, hk, c0, c1, ROW: ttgl.constexpr, P: ttgl.constexpr, TW: ttgl.constexpr,
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
def k_load(KC, KS, KZ, IDX, t0, hi, hk, kc0, kc1, ks0, ks1, CODEC: ttgl.constexpr, WK: ttgl.constexpr,
           G: ttgl.constexpr, P: ttgl.constexpr, TW: ttgl.constexpr, KW: ttgl.constexpr, NW: ttgl.constexpr,
           D: ttgl.constexpr):
    """Raw K code words [NW, WK, r, TW] (int32), scales and zeros [NW, r, TW] (fp16; 1 / 0 where the codec
    has none) of tokens t0 + w * TW + [0, TW) of warp w, read unmasked (rows past `hi` are page 0 or unused
    rows of the last page; the kernel scores them -inf). Zeros share the scales' strides."""
    L3: ttgl.constexpr = ttgl.SliceLayout(3, KW)
    wi = ttgl.arange(0, WK, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(2, L3)))
    r = ttgl.arange(0, 4, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(1, L3)))
    word = (WK * r[None, None, :] + wi[None, :, None])[:, :, :, None]  # [1, wi, r, 1]
    rows = tok_rows(IDX, t0, hi, hk, kc0, kc1, 4 * WK, P, TW, TW, 1, ttgl.SliceLayout(1, ttgl.SliceLayout(2, KW)), NW)
    w = ttgl.load(KC + rows[:, None, None, :] + word)
    LS: ttgl.constexpr = ttgl.SliceLayout(1, KW)
    m = ttgl.full([NW, 4, TW], 0.0, ttgl.float16, layout=LS)
    if CODEC == C_F8:
        s = ttgl.full([NW, 4, TW], 1.0, ttgl.float16, layout=LS)
    else:
        rs = ttgl.arange(0, 4, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(2, LS)))
        srows = tok_rows(IDX, t0, hi, hk, ks0, ks1, D // G, P, TW, TW, 1, ttgl.SliceLayout(1, LS), NW)
        rs = rs * (D // 4) // G  # the group of the thread's D / 4 channels
        s = ttgl.load(KS + srows[:, None, :] + rs[None, :, None])
        if CODEC == C_Q4A or CODEC == C_I8A:
            m = ttgl.load(KZ + srows[:, None, :] + rs[None, :, None])
    return w, s, m


@gluon.jit
def v_load(VC, VS, VZ, IDX, t0, hi, hk, vc0, vc1, vs0, vs1, CODEC: ttgl.constexpr, WV: ttgl.constexpr,
           G: ttgl.constexpr, P: ttgl.constexpr, TW: ttgl.constexpr, VW: ttgl.constexpr, VWA: ttgl.constexpr,
           NW: ttgl.constexpr, D: ttgl.constexpr):
    """Raw V code words of tokens t0 + w * TW + [0, TW) of warp w, as the words of the first and second token
    of each fragment pair ([NW, WV, g, c] int32), and their scales and zeros ([NW, g, c] fp16: 0 past `hi`,
    so those rows are exactly 0; for F8 the scales are 1 and the codes past `hi` are read as 0)."""
    L3: ttgl.constexpr = ttgl.SliceLayout(3, VW)
    we = ttgl.arange(0, WV, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(2, L3)))
    g = ttgl.arange(0, 8, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(1, L3)))
    word = (WV * g[None, None, :] + we[None, :, None])[:, :, :, None]  # [1, we, g, 1]
    L2W: ttgl.constexpr = ttgl.SliceLayout(1, ttgl.SliceLayout(2, VW))  # [NW, TW]
    rows = tok_rows(IDX, t0, hi, hk, vc0, vc1, 8 * WV, P, TW, TW, 1, L2W, NW)
    if CODEC == C_F8:  # no scale to zero the rows past `hi` with: their codes (NaN patterns too) are read as 0
        tt = (t0 + ttgl.arange(0, NW, layout=ttgl.SliceLayout(1, L2W)) * TW)[:, None] + \
            ttgl.arange(0, TW, layout=ttgl.SliceLayout(0, L2W))[None, :]
        w = ttgl.load(VC + rows[:, None, None, :] + word, mask=(tt < hi)[:, None, None, :], other=0)
    else:
        w = ttgl.load(VC + rows[:, None, None, :] + word)  # [NW, we, g, TW]
    wa, wb = ttgl.split(ttgl.reshape(w, [NW, WV, 8, TW // 2, 2]))  # tokens 2c, 2c + 1: [NW, we, g, c]
    wa = ttgl.convert_layout(wa, VWA, assert_trivial=True)
    wb = ttgl.convert_layout(wb, VWA, assert_trivial=True)
    S3: ttgl.constexpr = ttgl.SliceLayout(1, VWA)  # [NW, g, c]
    ma = ttgl.full([NW, 8, TW // 2], 0.0, ttgl.float16, layout=S3)
    mb = ma
    if CODEC == C_F8:
        sa = ttgl.full([NW, 8, TW // 2], 1.0, ttgl.float16, layout=S3)
        sb = sa
    else:  # scales of tokens 2c and 2c + 1 (one page: P is even) for the block of the thread's bytes (g // 2)
        sg = ttgl.arange(0, 8, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(2, S3)))
        L2: ttgl.constexpr = ttgl.SliceLayout(1, S3)  # [NW, c]
        srow = tok_rows(IDX, t0, hi, hk, vs0, vs1, D // G, P, TW, TW // 2, 2, L2, NW)  # first token of a pair
        tw = ttgl.arange(0, NW, layout=ttgl.SliceLayout(1, L2))
        tc = ttgl.arange(0, TW // 2, layout=ttgl.SliceLayout(0, L2))
        ta = (t0 + tw * TW)[:, None] + 2 * tc[None, :]  # [NW, c] first token of the pair
        off = srow[:, None, :] + (sg * (D // 8) // G)[None, :, None]  # the group of the thread's D / 8 channels
        sa = ttgl.load(VS + off, mask=(ta < hi)[:, None, :], other=0.0)
        sb = ttgl.load(VS + off + D // G, mask=(ta + 1 < hi)[:, None, :], other=0.0)
        if CODEC == C_Q4A or CODEC == C_I8A:
            ma = ttgl.load(VZ + off, mask=(ta < hi)[:, None, :], other=0.0)
            mb = ttgl.load(VZ + off + D // G, mask=(ta + 1 < hi)[:, None, :], other=0.0)
    return wa, wb, sa, sb, ma, mb


# ---- fragment builders ---------------------------------------------------------------------------------
@gluon.jit
def _j2(a, b):
    return ttgl.join(a, b)


@gluon.jit
def k_build(w, s, m, CODEC: ttgl.constexpr, B: ttgl.constexpr, NW: ttgl.constexpr, TW: ttgl.constexpr,
            D: ttgl.constexpr):
    """K^T fragment [NW, D, TW] fp16, contraction in k_channel_order(CODEC), from `k_load`'s words, scales
    and zeros."""
    s = ttgl.broadcast(ttgl.expand_dims(s, 1), w)[0]
    if CODEC == C_Q4 or CODEC == C_Q4A:
        if CODEC == C_Q4:
            o = ttgl.inline_asm_elementwise(ASM_K_Q4, "=h,=h,=h,=h,=h,=h,=h,=h,r,h,h", [w, s, s * 0.0625],
                                            dtype=(ttgl.float16,) * 8, is_pure=True, pack=1)
        else:
            m = ttgl.broadcast(ttgl.expand_dims(m, 1), w)[0]
            o = ttgl.inline_asm_elementwise(ASM_K_Q4A, "=h,=h,=h,=h,=h,=h,=h,=h,r,h,h,h", [w, s, s * 0.0625, m],
                                            dtype=(ttgl.float16,) * 8, is_pure=True, pack=1)
        j = ttgl.join(ttgl.join(_j2(o[0], o[1]), _j2(o[2], o[3])),
                      ttgl.join(_j2(o[4], o[5]), _j2(o[6], o[7])))  # [NW, wi, r, TW, h2, q0, q1]
        j = ttgl.permute(j, [0, 1, 6, 5, 2, 4, 3])  # [NW, wi, q1, q0, r, h2, TW]
    else:
        if CODEC == C_I8:
            o = ttgl.inline_asm_elementwise(ASM_K_I8, "=h,=h,=h,=h,r,h", [w, s], dtype=(ttgl.float16,) * 4,
                                            is_pure=True, pack=1)
        elif CODEC == C_I8A:
            m = ttgl.broadcast(ttgl.expand_dims(m, 1), w)[0]
            o = ttgl.inline_asm_elementwise(ASM_K_I8A, "=h,=h,=h,=h,r,h,h", [w, s, m], dtype=(ttgl.float16,) * 4,
                                            is_pure=True, pack=1)
        else:
            o = ttgl.inline_asm_elementwise(ASM_K_F8, "=h,=h,=h,=h,r", [w], dtype=(ttgl.float16,) * 4,
                                            is_pure=True, pack=1)
        j = ttgl.join(_j2(o[0], o[1]), _j2(o[2], o[3]))  # [NW, wi, r, TW, h2, q]
        j = ttgl.permute(j, [0, 1, 5, 2, 4, 3])  # [NW, wi, q, r, h2, TW]
    return ttgl.convert_layout(ttgl.reshape(j, [NW, D, TW]), B, assert_trivial=True)


@gluon.jit
def _v_q4(wa, wb, sa, sb, sa16, sb16, ASM: ttgl.constexpr):
    o = ttgl.inline_asm_elementwise(ASM, "=h,=h,=h,=h,r,r,h,h,h,h", [wa, wb, sa, sb, sa16, sb16],
                                    dtype=(ttgl.float16,) * 4, is_pure=True, pack=1)
    return ttgl.join(_j2(o[0], o[1]), _j2(o[2], o[3]))  # [..., t0, h]


@gluon.jit
def _v_q4a(wa, wb, sa, sb, sa16, sb16, ma, mb, ASM: ttgl.constexpr):
    o = ttgl.inline_asm_elementwise(ASM, "=h,=h,=h,=h,r,r,h,h,h,h,h,h", [wa, wb, sa, sb, sa16, sb16, ma, mb],
                                    dtype=(ttgl.float16,) * 4, is_pure=True, pack=1)
    return ttgl.join(_j2(o[0], o[1]), _j2(o[2], o[3]))  # [..., t0, h]


@gluon.jit
def _v_i8(wa, wb, sa, sb, ASM: ttgl.constexpr):
    o = ttgl.inline_asm_elementwise(ASM, "=h,=h,r,r,h,h", [wa, wb, sa, sb], dtype=(ttgl.float16,) * 2,
                                    is_pure=True, pack=1)
    return _j2(o[0], o[1])  # [..., t0]


@gluon.jit
def _v_i8a(wa, wb, sa, sb, ma, mb, ASM: ttgl.constexpr):
    o = ttgl.inline_asm_elementwise(ASM, "=h,=h,r,r,h,h,h,h", [wa, wb, sa, sb, ma, mb], dtype=(ttgl.float16,) * 2,
                                    is_pure=True, pack=1)
    return _j2(o[0], o[1])  # [..., t0]


@gluon.jit
def _v_f8(wa, wb, ASM: ttgl.constexpr):
    o = ttgl.inline_asm_elementwise(ASM, "=h,=h,r,r", [wa, wb], dtype=(ttgl.float16,) * 2, is_pure=True, pack=1)
    return _j2(o[0], o[1])  # [..., t0]


@gluon.jit
def v_build(wa, wb, sa, sb, ma, mb, CODEC: ttgl.constexpr, B: ttgl.constexpr, NW: ttgl.constexpr,
            TW: ttgl.constexpr, D: ttgl.constexpr):
    """V fragment [NW, TW, D] fp16, columns in v_channel_order(CODEC), from `v_load`'s words, scales, zeros."""
    sa = ttgl.broadcast(ttgl.expand_dims(sa, 1), wa)[0]
    sb = ttgl.broadcast(ttgl.expand_dims(sb, 1), wa)[0]
    if CODEC == C_Q4 or CODEC == C_Q4A:
        sa16 = sa * 0.0625
        sb16 = sb * 0.0625
        if CODEC == C_Q4:
            j = ttgl.join(ttgl.join(_v_q4(wa, wb, sa, sb, sa16, sb16, AVQ0), _v_q4(wa, wb, sa, sb, sa16, sb16, AVQ1)),
                          ttgl.join(_v_q4(wa, wb, sa, sb, sa16, sb16, AVQ2), _v_q4(wa, wb, sa, sb, sa16, sb16, AVQ3)))
        else:
            ma = ttgl.broadcast(ttgl.expand_dims(ma, 1), wa)[0]
            mb = ttgl.broadcast(ttgl.expand_dims(mb, 1), wa)[0]
            j = ttgl.join(ttgl.join(_v_q4a(wa, wb, sa, sb, sa16, sb16, ma, mb, AVA0),
                                    _v_q4a(wa, wb, sa, sb, sa16, sb16, ma, mb, AVA1)),
                          ttgl.join(_v_q4a(wa, wb, sa, sb, sa16, sb16, ma, mb, AVA2),
                                    _v_q4a(wa, wb, sa, sb, sa16, sb16, ma, mb, AVA3)))
        j = ttgl.permute(j, [0, 3, 4, 1, 7, 6, 5, 2])  # [NW, we, g, c, t0, h, k0, k1] -> [NW, c, t0, we, k1, k0, h, g]
    else:
        if CODEC == C_I8:
            j = ttgl.join(ttgl.join(_v_i8(wa, wb, sa, sb, AVI0), _v_i8(wa, wb, sa, sb, AVI1)),
                          ttgl.join(_v_i8(wa, wb, sa, sb, AVI2), _v_i8(wa, wb, sa, sb, AVI3)))
        elif CODEC == C_I8A:
            ma = ttgl.broadcast(ttgl.expand_dims(ma, 1), wa)[0]
            mb = ttgl.broadcast(ttgl.expand_dims(mb, 1), wa)[0]
            j = ttgl.join(ttgl.join(_v_i8a(wa, wb, sa, sb, ma, mb, AVB0), _v_i8a(wa, wb, sa, sb, ma, mb, AVB1)),
                          ttgl.join(_v_i8a(wa, wb, sa, sb, ma, mb, AVB2), _v_i8a(wa, wb, sa, sb, ma, mb, AVB3)))
        else:
            j = ttgl.join(ttgl.join(_v_f8(wa, wb, AVF0), _v_f8(wa, wb, AVF1)),
                          ttgl.join(_v_f8(wa, wb, AVF2), _v_f8(wa, wb, AVF3)))
        j = ttgl.permute(j, [0, 3, 4, 1, 6, 5, 2])  # [NW, we, g, c, t0, k0, k1] -> [NW, c, t0, we, k1, k0, g]
    return ttgl.convert_layout(ttgl.reshape(j, [NW, TW, D]), B, assert_trivial=True)
