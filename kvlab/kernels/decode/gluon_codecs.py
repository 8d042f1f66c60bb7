"""Code formats of the Gluon MMA-fragment decode (gluon.py): loads and fragment builders per codec.

A codec turns a page's code words into fp16 `mma.sync.m16n8k16` B-operand fragments in registers:
- Q4 (0): int4 sym group 32, fp16 scales (q4_0; GGML or sequential nibbles): v = (nibble - 8) s.
- I8 (1): q8_0 / int8 sym group 32, fp16 scales, two's-complement bytes: v = byte s.
- F8 (2): fp8_e4m3 bytes (optionally one per-tensor scale, applied by the kernel): v = e4m3(byte).
- Q4A (3): int4 asym group 32, fp16 scales and zeros (q4_1, int4:g32:asym, int4_had): v = nibble s + m.
- I8A (4): int8 asym, fp16 scales and zeros: v = byte s + m (byte unsigned).
- Q2 (5) / Q2A (6): int2 sym / asym, fp16 scales (and zeros) (int2:g32:asym, kivi2's values): v = (c - 2) s,
  c s + m. A word holds 16 codes; fields 1 and 3 of a byte come out as 4 c and meet s / 4, fields 2 and 3 are
  read from the word shifted by 4 (one SHR, so no field ever needs s / 16 or s / 64).
- KC4 (7) / KC2 (8) / KC3 (16): KIVI's channel-axis keys (int4 / int2 / int3 asym, per-channel scales and zeros per
  token group).
- F4M (9) / F4N (10): fp4 e2m1 with e8m0 (mxfp4) or e4m3 + tensor (nvfp4) group scales.
- CB (11): 4-bit codebooks (nf4, iq4nl, lm4): a 16-entry fp16 table passed per call.
- I3 (12) / I3A (13): int3 (a 2-bit and a 1-bit plane per group), groups of 32, 64 or 128.
- CB2 (14): 2-bit codebooks (lm2) with fp16 scales, in int2's layout: a 4-entry fp16 table in 2 registers.
- CB3 (15): 3-bit codebooks (lm3) with fp16 scales, in int3's layout: an 8-entry fp16 table in 4 registers.
- KT2 (17) / KT3 (18) / KT4 (19): calibrated int2 / int3 / int4 channel-axis keys (`int<b>:g32:chan:asym:cal`):
  KC2's / KC3's / KC4's layout and loads, each code looked up in the layer's level table (4, 8 or 16 fp16 entries,
  PRMTs as the codebooks'), then times the scale plus the zero.
- Q4G (20): Q4's keys read by scale groups (`gluon.GROUPED_K`): thread-row r reads word r of each group, the codes enter
  the MMA as 1024 + n, and the scales and offsets apply to each group's partial scores (`gluon._scores_tg`).
- KF4 (22) / KF2 (23): KC4's / KC2's keys with the scales and zeros folded out of the tile (`gluon.KIVI_FOLD`): the
  codes as fp16 subnormals, the query times the scales, the zeros' term one MMA (`gluon._scores_tf`).
- I5 (24) / I5A (25) / I6 (26) / I6A (27): int5 / int6 sym / asym (a 4-bit plane and a 1- or 2-bit plane per group,
  sequential packing, groups of 32, 64 or 128); I5G (28) / I5GA (29): int5 with GGML's q5_0 / q5_1 blocks (the 1-bit
  plane, then GGML nibbles, groups of 32). Each nibble comes out as Q4's, its plane bits OR-ed in above it.
Group scales are fp16 as loaded, or bytes converted to fp16 per row (`scale16`): e8m0 (mxfp4), e4m3 (nvfp4, and the
codebooks and symmetric int codecs with `s=e4m3`).
Each codec's asm and layout are described where it is defined below (benchmarks/NOTES_decode.md has a table).
Groups of 32, 64 or 128 channels (16 for fp4; one scale, and zero, per group): a thread's D / 8 value channels lie
in one group but for fp4's groups of 16 at D 256, where the values read a scale per code word; its D / 4 key
channels do at D 64 and 128, and where they span groups (D 256 with groups of 32) the keys read a scale (and zero)
per code word.
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

import os

from triton.experimental import gluon
from triton.experimental.gluon import language as ttgl

Q4, I8, F8, Q4A, I8A, Q2, Q2A = 0, 1, 2, 3, 4, 5, 6
# the same, for jit code
C_Q4, C_I8, C_F8, C_Q4A, C_I8A, C_Q2, C_Q2A = (ttgl.constexpr(c) for c in (Q4, I8, F8, Q4A, I8A, Q2, Q2A))
CODECS = {Q4: "int4 sym (q4_0)", Q4A: "int4 asym (q4_1, int4:g32:asym)", I8: "int8 sym (q8_0)", I8A: "int8 asym",
          F8: "fp8_e4m3 (no group scales)", Q2: "int2 sym", Q2A: "int2 asym (int2:g32:asym)"}
GROUPS = (32, 64, 128)  # int codecs: token-axis groups with fp16 scales (and zeros)
WORDS_K = {Q4: 4, I8: 8, F8: 8, Q4A: 4, I8A: 8, Q2: 2, Q2A: 2}   # 32-bit code words per thread per key row at D 128
WORDS_V = {Q4: 2, I8: 4, F8: 4, Q4A: 2, I8A: 4, Q2: 1, Q2A: 1}   # ... per value row (16 output columns)
ASYM = (Q4A, I8A, Q2A)  # codecs with zeros
# keys on the channel axis (KIVI): int4 / int2 asym, per-channel fp16 scales and zeros per token group
KC4, KC2 = 7, 8
C_KC4, C_KC2 = ttgl.constexpr(KC4), ttgl.constexpr(KC2)
# int3 channel-axis keys: a channel's token group holds a 2-bit plane (4 tokens a byte) then a 1-bit plane; the loader
# puts the 4 plane bits of a thread's byte in bits 8-11 of its unit, and the asm sets them above each field
KC3 = 16
C_KC3 = ttgl.constexpr(KC3)
CHAN = (KC4, KC2, KC3)
CODECS.update({KC4: "int4 asym channel-axis keys (kivi4)", KC2: "int2 asym channel-axis keys (kivi2)",
               KC3: "int3 asym channel-axis keys"})
CHAN_TW = 32  # tokens per warp the channel-axis codecs run with (a thread's 4 tokens of a channel: 2 or 1 bytes)
WORDS_K.update({KC4: 1, KC2: 1, KC3: 1})  # (unused: channel-axis keys load through kc_load)
# fp4 e2m1 (OCP MX / NVFP4): sign-magnitude nibbles through an 8-entry PRMT table; e8m0 (mxfp4) or e4m3 (nvfp4,
# with its fp32 tensor scale applied by the kernel as fp8's) group scales, converted to fp16 per row
F4M, F4N = 9, 10
C_F4M, C_F4N = ttgl.constexpr(F4M), ttgl.constexpr(F4N)
F4 = (F4M, F4N)
CODECS.update({F4M: "fp4_e2m1 with e8m0 scales (mxfp4)", F4N: "fp4_e2m1 with e4m3 scales and a tensor scale (nvfp4)"})
WORDS_K.update({F4M: 4, F4N: 4})
WORDS_V.update({F4M: 2, F4N: 2})
F4_GROUPS = (16, 32, 64, 128)
# 4-bit codebooks (nf4, iq4nl, lm4, any 16-entry table): a 16-entry fp16 table in 8 registers (the low and high
# bytes of entries 0-7 and 8-15), looked up by PRMT and picked by the code's bit 3; fp16 group scales
CB = 11
C_CB = ttgl.constexpr(CB)
CODECS[CB] = "4-bit codebooks (nf4, iq4nl, lm4) with fp16 or e4m3 scales"
WORDS_K[CB], WORDS_V[CB] = 4, 2
CB_FORMATS = ("nf4", "iq4nl", "lm4")
# int3 (2-bit plane + 1-bit plane, sequential; groups of 32 at head_dim 128): a thread-row of keys is one group (two
# 2-bit words, one plane word), a value thread-row half a group (one 2-bit word, 16 plane bits); codes as Q2's with the
# plane bit OR-ed in above each field
I3, I3A = 12, 13
C_I3, C_I3A = ttgl.constexpr(I3), ttgl.constexpr(I3A)
CODECS.update({I3: "int3 sym", I3A: "int3 asym (int3:g32:asym)"})
WORDS_K.update({I3: 2, I3A: 2})  # the 2-bit plane's words (the plane word is read beside them)
WORDS_V.update({I3: 1, I3A: 1})
ASYM = ASYM + (I3A,)
# 2-bit codebooks (lm2, any 4-entry table): int2's layout and loads (groups 32-128, half a word per value thread-row
# at D 64), each code looked up in the table's low-byte and high-byte words (`_cb2_lookup`); fp16 group scales
CB2 = 14
C_CB2 = ttgl.constexpr(CB2)
CODECS[CB2] = "2-bit codebooks (lm2) with fp16 or e4m3 scales"
WORDS_K[CB2], WORDS_V[CB2] = 2, 1
CB2_FORMATS = ("lm2",)
# 3-bit codebooks (lm3, any 8-entry table): int3's layout and loads, each code (2-bit field + plane bit) looked up in
# the table's low-byte and high-byte word pairs (`asm_cb3`); fp16 group scales
CB3 = 15
C_CB3 = ttgl.constexpr(CB3)
CODECS[CB3] = "3-bit codebooks (lm3) with fp16 or e4m3 scales"
WORDS_K[CB3], WORDS_V[CB3] = 2, 1
CB3_FORMATS = ("lm3",)
PLANE3 = (I3, I3A, CB3)  # codecs in int3's layout (a 2-bit plane and a 1-bit plane per group)
# calibrated channel-axis keys (`int<b>:...:chan:asym:cal`): KC2's / KC3's / KC4's units, each code's level from the
# pages' table (`cb_table_words`), then level s + m as the KC codecs do with the code
KT2, KT3, KT4 = 17, 18, 19
C_KT2, C_KT3, C_KT4 = (ttgl.constexpr(c) for c in (KT2, KT3, KT4))
CHAN = CHAN + (KT2, KT3, KT4)
CODECS.update({KT2: "calibrated int2 asym channel-axis keys (a 4-entry level table)",
               KT3: "calibrated int3 asym channel-axis keys (an 8-entry level table)",
               KT4: "calibrated int4 asym channel-axis keys (a 16-entry level table)"})
WORDS_K.update({KT2: 1, KT3: 1, KT4: 1})
TABLES = (CB, CB2, CB3, KT2, KT3, KT4)  # codecs that read a codebook table (`cb_table_words`)
# KIVI's int4 keys with their scales and zeros folded out of the tile (`gluon.KIVI_FOLD`, with the transposed scores):
# within a warp's 32-token tile a channel's scale s and zero m are one pair (the tile is within one token group), so
# the scores are sum_c n s_c q_c + sum_c m_c q_c: the codes enter the MMA as fp16 subnormals (one AND: n 2^-24, 16 n
# 2^-24 for the odd tokens' high nibbles), the query as q s (one HMUL2 a register a tile), and sum_c m_c q_c is one
# MMA chain of the zeros (every row) by the query; the scores then take 2^24 (2^20 at odd tokens) in one FFMA with it
# KF2: the same for KIVI's int2 keys (n 2^-24, 4 n 2^-24 at odd tokens)
KF4, KF2 = 22, 23
C_KF4, C_KF2 = ttgl.constexpr(KF4), ttgl.constexpr(KF2)
CHAN = CHAN + (KF4, KF2)
CODECS.update({KF4: "int4 asym channel-axis keys with scales and zeros folded into the query (kivi4 keys, KIVI_FOLD)",
               KF2: "int2 asym channel-axis keys with scales and zeros folded into the query (kivi2 keys, KIVI_FOLD)"})
WORDS_K.update({KF4: 1, KF2: 1})
FOLDED = {KF4: 4, KF2: 2}  # folded codec -> its code bits
# int4 sym keys by groups (q4_0 at groups of 32, keys only, with the transposed scores; `gluon.GROUPED_K`): thread-row r
# of a key row reads word r of each 32-channel group (the row's words r, 4 + r, 8 + r, ...), so each 16-deep MMA slice
# lies in one scale group. The codes enter the MMA as they come out of one LOP3, 1024 + n (1024 + 16 n for the high
# nibbles, whose query entries are divided by 16 beforehand): no per-element offset or scale. Each group's partial
# scores take its fp32 scale (an FFMA), and the offsets (1032 / 1152 times the group's query sum, taken in fp32 from
# the fp16 query the MMA reads) leave through one more MMA of the scales by the sums' fp16 high and low parts
# (`gluon._scores_tg`)
# (The same for int4 asym keys, q4_1's, with each group's zero times its query sum in the offsets' MMA, compiled to more
# loop instructions than q4_1's own path, offline on sm_90: 397 against 388 a 16-token tile; not kept. Session 28.)
Q4G = 20
C_Q4G = ttgl.constexpr(Q4G)
CODECS[Q4G] = "int4 sym keys read by scale groups (q4_0 keys, GROUPED_K)"
WORDS_K[Q4G], WORDS_V[Q4G] = 4, 2
# int5 / int6 (`int5:g32:asym`, q5_0 / q5_1, `int6:g32:sym`): a group's nibble plane, read in Q4's words, and its 1- or
# 2-bit plane (sequential bits: channel c of the group at bit PB c of the plane; GGML's qh is the same little-endian
# mask, stored before the nibbles). A value or key register pairs the same nibble of two words A and B (two tokens'
# words for values; two adjacent words of one row for keys), whose plane bits, each word's shifted to its first
# channel, sit at the same offsets of the two 16-bit halves of one PRMT of them, so one shift and one LOP3 per
# register set them above the nibble (`asm_np`)
I5, I5A, I6, I6A, I5G, I5GA = 24, 25, 26, 27, 28, 29
C_I5, C_I5A, C_I6, C_I6A, C_I5G, C_I5GA = (ttgl.constexpr(c) for c in (I5, I5A, I6, I6A, I5G, I5GA))
NIBP = (I5, I5A, I6, I6A, I5G, I5GA)  # codecs of a nibble plane and a high plane
CODECS.update({I5: "int5 sym", I5A: "int5 asym (int5:g32:asym)", I6: "int6 sym", I6A: "int6 asym",
               I5G: "int5 sym, GGML blocks (q5_0)", I5GA: "int5 asym, GGML blocks (q5_1)"})
WORDS_K.update(dict.fromkeys(NIBP, 4))  # the nibble plane's words (the high plane's word is read beside each)
WORDS_V.update(dict.fromkeys(NIBP, 2))
ASYM = ASYM + (I5A, I6A, I5GA)
_TABLE_OF = {**dict.fromkeys(CB_FORMATS, CB), **dict.fromkeys(CB2_FORMATS, CB2), **dict.fromkeys(CB3_FORMATS, CB3)}
# key codecs that read a scale (and zero) per code word where a thread-row's D / 4 channels span groups (D 256 with
# groups of 32: Gemma's heads with q4_0 / q8_0)
PER_WORD = (Q4, I8, Q4A, I8A, Q2, Q2A, F4M, F4N, CB, CB2) + PLANE3 + NIBP
# value codecs that read a scale per code word where a value thread-row's D / 8 channels span groups (groups of 16 at
# D 256: fp4, int4 sym, 16-entry codebooks; no zeros)
V_PER_WORD = (F4M, F4N, Q4, CB)
HEAD_DIMS = (64, 128, 256)
# stored group-scale dtypes the loaders convert to fp16 (`scale16`): fp16 as is; e8m0 (mxfp4) and e4m3 bytes. e4m3
# scales also serve the codebooks and the symmetric int codecs (`lm2:s=e4m3`: 2.125 bits at groups of 64); codecs
# with zeros keep fp16 scales (their zeros are fp16 words beside them)
SCALE_DTYPES = {"f16": 0, "e8m0": 1, "e4m3": 2}


def scale_code(spec) -> int:
    """The `scale16` code of a spec's stored group scales: 0 for fp16 (or none), nonzero for scale bytes."""
    return SCALE_DTYPES.get(spec.scale_dtype, 0)


def _scales_ok(spec, byte_scales: bool) -> bool:
    """Group scales a token-axis codec reads: fp16; e4m3 too for symmetric codecs (`byte_scales`)."""
    return spec.scale_dtype == "f16" or (byte_scales and spec.scale_dtype == "e4m3" and not spec.tensor_scale)


def words_k(codec: int, D: int = 128) -> int:
    """Code words per thread per key row at head dim D (a thread holds D / 4 channels)."""
    return WORDS_K[codec] * D // 128


def words_v(codec: int, D: int = 128) -> int:
    """Code words per thread per value row at head dim D (a thread holds D / 8 output columns). int2 at D 64
    holds half a word: 1 here, and `v_half` says so."""
    return max(1, WORDS_V[codec] * D // 128)


def v_half(codec: int, D: int) -> bool:
    """True where a value thread-row is half a code word (int2 at D 64: 8 channels, 2 bytes): two threads read
    the same word, the odd one shifted down by 16 bits, and decode its bytes 0 and 1."""
    return codec in (Q2, Q2A, CB2) and WORDS_V[codec] * D < 128


def codec_of(spec, role: str = "k") -> int | None:
    """The codec that decodes `spec`'s pages as keys (role "k") or values ("v"), or None."""
    if spec.pre_rope or (spec.tensor_scale and spec.fmt != "fp4_e2m1") or spec.twos or \
            spec.rotation not in ("none", "had") or spec.outliers:
        return None  # (two's-complement sub-byte codes: FreeToken; the codecs read offset binary; outlier slots:
        # the Triton tiles write them over the dequantized rows)
    kivi = spec.fmt == "int" and spec.axis == "chan" and role == "k" and not spec.sym and spec.pack == "seq" and \
        spec.group in GROUPS and spec.scale_dtype == "f16"
    if spec.fmt == "int" and spec.calibrated:  # level tables: channel-axis keys only (else the Triton tiles)
        return {2: KT2, 3: KT3, 4: KT4}[spec.bits] if kivi else None
    if kivi and spec.bits in (2, 3, 4):
        return {4: KC4, 3: KC3, 2: KC2}[spec.bits]
    # (int4 also at groups of 16: a scale, and zero, per code word)
    if spec.fmt == "int" and spec.axis == "tok" and (spec.group in GROUPS or (spec.group == 16 and spec.bits == 4)) \
            and _scales_ok(spec, spec.sym):
        if spec.bits == 4 and spec.pack in ("ggml", "seq"):
            return Q4 if spec.sym else Q4A
        if spec.bits == 8:
            return I8 if spec.sym else I8A
        if spec.bits == 2 and spec.pack in ("ggml", "seq"):
            return Q2 if spec.sym else Q2A
        if spec.bits == 3 and spec.pack == "seq" and tuple(spec.planes) == (2, 1):
            return I3 if spec.sym else I3A
        if spec.bits in (5, 6) and tuple(spec.planes) == (4, spec.bits - 4):
            if spec.pack == "seq":
                return {(5, True): I5, (5, False): I5A, (6, True): I6, (6, False): I6A}[spec.bits, spec.sym]
            if spec.pack == "ggml" and spec.bits == 5 and spec.group == 32:
                return I5G if spec.sym else I5GA
    if spec.fmt == "fp8_e4m3" and spec.axis == "tensor":
        return F8
    table = _TABLE_OF.get(spec.fmt)  # codebooks; the 3-bit one in int3's layout, sequential packing only
    if table is not None and spec.axis == "tok" and (spec.group in GROUPS or (spec.group == 16 and table == CB)) and \
            _scales_ok(spec, True) and spec.pack in (("seq",) if table == CB3 else ("ggml", "seq")):
        return table
    if spec.fmt == "fp4_e2m1" and spec.axis == "tok" and spec.group in F4_GROUPS and spec.pack in ("ggml", "seq"):
        if spec.scale_dtype == "e8m0" and not spec.tensor_scale:
            return F4M
        if spec.scale_dtype == "e4m3":
            return F4N
    return None


def _nibble_channel(j: int, h: int, pack: str, G: int = 32, per: int = 2) -> int:
    """Channel of field h of byte j of a row of `per` codes per byte (int4: 2, nibble h; int2: 4): GGML holds
    elements i, i + G / per, ... of each G-group in byte G / per * g + i, sequential packing per j + h."""
    n = G // per
    return G * (j // n) + j % n + n * h if pack == "ggml" else per * j + h


def k_channel_order(codec: int = Q4, pack: str = "ggml", G: int = 32, D: int = 128) -> list[int]:
    """Head-dim channel of each score contraction index kappa = h2 + 2 r + 8 x (x = the thread's register);
    thread r reads the 4 WK bytes of its row from byte 4 WK r on (WK = words_k(codec, D))."""
    if codec in CHAN:  # thread r holds the channel pairs (D / 4 r + 2 x, + 1): its scales are one contiguous run
        return [D // 4 * ((kap >> 1) & 3) + 2 * (kap >> 3) + (kap & 1) for kap in range(D)]
    if codec in PLANE3:  # register x = f + 4 k (+ 16 u at D 256: run u of 32 channels) pairs channel 4 k + f of the
        # run's first and second 2-bit word (D 64: the word's bytes 0-1 and 2-3)
        if D == 64:
            return [16 * ((kap >> 1) & 3) + 8 * (kap & 1) + (kap >> 3) for kap in range(D)]
        return [D // 4 * ((kap >> 1) & 3) + 32 * (kap >> 7) + 16 * (kap & 1) + ((kap >> 3) & 15) for kap in range(D)]
    out, rb = [], 4 * words_k(codec, D)
    if codec in NIBP:  # register x = f + 2 k + 8 u pairs nibble f of byte k of the thread-row's words 2 u (h2 = 0) and
        # 2 u + 1 (h2 = 1), the row's nibble bytes counted without the high plane's
        for kap in range(D):
            h2, r, x = kap & 1, (kap >> 1) & 3, kap >> 3
            f, k, u = x & 1, (x >> 1) & 3, x >> 3
            out.append(_nibble_channel(rb * r + 4 * (2 * u + h2) + k, f, "ggml" if codec in (I5G, I5GA) else "seq", G))
        return out
    for kap in range(D):
        h2, r, x = kap & 1, (kap >> 1) & 3, kap >> 3
        if codec == Q4G:  # register x = q + 4 wi: word wi of thread r is word r of group wi (`C_Q4G`)
            q, wi = x & 3, x >> 2
            out.append(_nibble_channel(4 * (4 * wi + r) + (q >> 1) + 2 * h2, q & 1, pack, G))
        elif codec in (Q4, Q4A, F4M, F4N, CB):  # register x = q + 4 wi: byte (q >> 1) + 2 h2 of word wi, nibble q & 1
            q, wi = x & 3, x >> 2
            out.append(_nibble_channel(rb * r + 4 * wi + (q >> 1) + 2 * h2, q & 1, pack, G))
        elif codec in (I8, I8A):  # register x = q + 2 wi holds bytes (q, q + 2) of word wi
            q, wi = x & 1, x >> 1
            out.append(rb * r + 4 * wi + q + 2 * h2)
        elif codec in (Q2, Q2A, CB2):  # register x = q + 8 wi holds byte (q >> 2) + 2 h2 of word wi, field q & 3
            q, wi = x & 7, x >> 3
            out.append(_nibble_channel(rb * r + 4 * wi + (q >> 2) + 2 * h2, q & 3, pack, G, 4))
        else:  # F8: register x = q + 2 wi holds bytes (2 q, 2 q + 1) of word wi
            q, wi = x & 1, x >> 1
            out.append(rb * r + 4 * wi + 2 * q + h2)
    return out


def v_channel_order(codec: int = Q4, pack: str = "ggml", G: int = 32, D: int = 128) -> list[int]:
    """Head-dim channel of each output column n = g + 8 nt; thread g reads the 4 WV bytes of a row from byte
    4 WV g on (WV = words_v(codec, D))."""
    out, gb = [], (2 if v_half(codec, D) else 4 * words_v(codec, D))
    for n in range(D):
        g, nt = n & 7, n >> 3
        if codec in (Q4, Q4A, F4M, F4N, CB) + NIBP:  # nt = h + 2 k + 8 we: nibble h of byte k of word we of the
            # thread's (nibble) bytes
            h, k, we = nt & 1, (nt >> 1) & 3, nt >> 3
            out.append(_nibble_channel(gb * g + 4 * we + k, h, pack, G))
        elif codec in (Q2, Q2A, CB2):  # nt = f + 4 k + 16 we: field f of byte k of word we
            f, k, we = nt & 3, (nt >> 2) & 3, nt >> 4
            out.append(_nibble_channel(gb * g + 4 * we + k, f, pack, G, 4))
        elif codec in PLANE3:  # nt = f + 4 k: the thread's D / 8 channels, field f of byte k
            out.append(D // 8 * g + nt)
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
# int4 keys by groups (`C_Q4G`): the registers of `_asm_k4` before its offset and scale, 1024 + n (low nibbles) and
# 1024 + 16 n (high); in $8 w
ASM_K_Q4G = ttgl.constexpr("\n".join([
    "{ .reg .b32 u, r0, r1, r2, r3;", "shr.b32 u, $8, 8;",
    "lop3.b32 r0, $8, 0x000F000F, 0x64006400, 0xEA;", "lop3.b32 r1, $8, 0x00F000F0, 0x64006400, 0xEA;",
    "lop3.b32 r2, u, 0x000F000F, 0x64006400, 0xEA;", "lop3.b32 r3, u, 0x00F000F0, 0x64006400, 0xEA;",
    "mov.b32 {$0, $1}, r0;", "mov.b32 {$2, $3}, r1;", "mov.b32 {$4, $5}, r2;", "mov.b32 {$6, $7}, r3; }"]))
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
def _asm_2bit_fin(asym: bool, out: list[str], regs: list[str], src: list[str], s_ops: str, s4_ops: str,
                  m_ops: str, offsets: tuple[int, int] = (2, 8), extra=None) -> str:
    """Int2 asm body (int3 too): register regs[i] = lop3 of word src[i // 2] with field mask 0x00030003 (i even: c)
    or 0x000C000C (i odd: 4 c) into the 0x6400 magic, then the lines extra(i, reg) (int3: its plane bit), minus 1024
    (+ the sym offsets of the two field positions), times s or s / 4 (asym: plus m, one HFMA2); outputs the halves of
    each register in order."""
    c0, c1 = ("0xE400E400", "0xE400E400") if asym else tuple(f"0x{0xE400 + o:04X}{0xE400 + o:04X}" for o in offsets)
    fin = "fma.rn.f16x2 {r}, {r}, {s}, m1;" if asym else "mul.rn.f16x2 {r}, {r}, {s};"
    lines = [f"mov.b32 c0, {c0};", f"mov.b32 c1, {c1};", f"mov.b32 s1, {{{s_ops}}};",
             f"mov.b32 s4, {{{s4_ops}}};"] + ([f"mov.b32 m1, {{{m_ops}}};"] if asym else [])
    for i, r in enumerate(regs):
        mask = "0x000C000C" if i & 1 else "0x00030003"
        lines += [f"lop3.b32 {r}, {src[i // 2]}, {mask}, 0x64006400, 0xEA;", *(extra(i, r) if extra else []),
                  f"add.rn.f16x2 {r}, {r}, {'c1' if i & 1 else 'c0'};", fin.format(r=r, s="s4" if i & 1 else "s1")]
    lines += [f"mov.b32 {{{out[2 * i]}, {out[2 * i + 1]}}}, {r};" for i, r in enumerate(regs)]
    return "\n".join(lines) + " }"


def _asm_k2(asym: bool) -> str:
    """Int2 keys: word -> registers j = 0..7 holding bytes ((j >> 2), (j >> 2) + 2), field j & 3, i.e.
    (b0, b2) fields 0-3, then (b1, b3) fields 0-3. In: $16 w, $17 s, $18 s / 4 (asym: $19 m). Fields 2 and 3
    are fields 0 and 1 of the word shifted by 4, the odd bytes those of the word shifted by 8 and 12."""
    regs = [f"r{j}" for j in range(8)]
    head = ["{ .reg .b32 u, v, x, " + ", ".join(regs) + ", s1, s4, c0, c1, m1;",
            "shr.b32 v, $16, 4;", "shr.b32 u, $16, 8;", "shr.b32 x, $16, 12;"]
    return "\n".join(head) + "\n" + _asm_2bit_fin(asym, [f"${i}" for i in range(16)], regs, ["$16", "v", "u", "x"],
                                                   "$17, $17", "$18, $18", "$19, $19")


def _asm_v2(asym: bool) -> str:
    """Int2 values, byte k of words A and B -> (f0 A, f0 B, f1 A, f1 B, f2 A, f2 B, f3 A, f3 B). In: $8 wA,
    $9 wB, $10 sA, $11 sB, $12 sA / 4, $13 sB / 4 (asym: $14 mA, $15 mB)."""
    regs = ["r0", "r1", "r2", "r3"]
    head = ["{ .reg .b32 t, v, r0, r1, r2, r3, s1, s4, c0, c1, m1;", "prmt.b32 t, $8, $9, SEL;", "shr.b32 v, t, 4;"]
    return "\n".join(head) + "\n" + _asm_2bit_fin(asym, [f"${i}" for i in range(8)], regs, ["t", "v"],
                                                   "$10, $11", "$12, $13", "$14, $15")


def _plane_bit(r: str, bit: int, top: int) -> list[str]:
    """OR plane bit `bit` of each half of pp into bit `top` of the same half of register r (x is scratch): the
    3-bit formats' plane bit set just above its 2-bit field."""
    sh = top - bit
    move = f"shl.b32 x, pp, {sh};" if sh > 0 else (f"shr.b32 x, pp, {-sh};" if sh < 0 else "mov.b32 x, pp;")
    return [move, f"lop3.b32 {r}, {r}, x, 0x{1 << top:04X}{1 << top:04X}, 0xF8;"]


def asm_kc(codec: int, k: int) -> str:
    """Channel-axis keys, the pair of channels (c0, c1) of a thread: byte k of c0's and c1's code runs of its 4
    tokens (words A and B) -> registers (c0, c1) per token. KC4 (bytes 0-1 hold tokens 0-3, low nibble first):
    (tok 2k: c0, c1, tok 2k + 1: c0, c1); KC2 (byte 0 holds tokens 0-3, field f = token f): (tok 0: c0, c1, ...,
    tok 3: c0, c1). In: $n wA, wB, then the scale pair (s0, s1) and the zero pair as packed f16x2 words
    (n = 4 outputs for KC4, 8 for KC2). c s + m with one HFMA2; the high nibble / odd fields meet s / 16 / s / 4."""
    n = 4 if codec == KC4 else 8
    a, b, sw, mw = (f"${n + i}" for i in range(4))
    sel = f"0x{4 + k}{4 + k}{k}{k}"
    if codec == KC4:
        fields = [("t", "0x000F000F", "s1"), ("t", "0x00F000F0", "s2")]
        div = "0x2C002C00"  # 1 / 16
    else:
        fields = [("t", "0x00030003", "s1"), ("t", "0x000C000C", "s2"), ("v", "0x00030003", "s1"),
                  ("v", "0x000C000C", "s2")]
        div = "0x34003400"  # 1 / 4
    regs = [f"r{i}" for i in range(len(fields))]
    lines = ["{ .reg .b32 t, v, c, d, s2, " + ", ".join(regs) + ";", f"prmt.b32 t, {a}, {b}, {sel};"] + (
        ["shr.b32 v, t, 4;"] if codec == KC2 else []) + ["mov.b32 c, 0xE400E400;", f"mov.b32 d, {div};",
                                                        f"mul.rn.f16x2 s2, {sw}, d;"]
    for r, (src, mask, sc) in zip(regs, fields):
        lines += [f"lop3.b32 {r}, {src}, {mask}, 0x64006400, 0xEA;", f"add.rn.f16x2 {r}, {r}, c;",
                  f"fma.rn.f16x2 {r}, {r}, {sw if sc == 's1' else 's2'}, {mw};"]
    lines += [f"mov.b32 {{${2 * i}, ${2 * i + 1}}}, {r};" for i, r in enumerate(regs)]
    return "\n".join(lines) + " }"


def asm_kc3() -> str:
    """int3 channel-axis keys: the units of channels c0 and c1 (words A and B: byte 0 = the 2-bit fields of tokens
    0-3, bits 8-11 = their plane bits) -> registers (c0, c1) per token 0-3, code = field | plane bit << 2, as KC2
    with each plane bit OR-ed in just above its field before the fp16 magic is removed. In: $8 wA, $9 wB, $10 the
    scale pair, $11 the zero pair (packed f16x2)."""
    lines = ["{ .reg .b32 t, v, pp, x, c, d, s2, r0, r1, r2, r3;", "prmt.b32 t, $8, $9, 0x4400;", "shr.b32 v, t, 4;",
             "prmt.b32 pp, $8, $9, 0x5410;", "mov.b32 c, 0xE400E400;", "mov.b32 d, 0x34003400;",
             "mul.rn.f16x2 s2, $10, d;"]
    for f in range(4):
        src, mask = ("t" if f < 2 else "v"), ("0x000C000C" if f & 1 else "0x00030003")
        lines += [f"lop3.b32 r{f}, {src}, {mask}, 0x64006400, 0xEA;", *_plane_bit(f"r{f}", 8 + f, 4 if f & 1 else 2),
                  f"add.rn.f16x2 r{f}, r{f}, c;",
                  f"fma.rn.f16x2 r{f}, r{f}, {'$10' if f % 2 == 0 else 's2'}, $11;"]
    lines += [f"mov.b32 {{${2 * f}, ${2 * f + 1}}}, r{f};" for f in range(4)]
    return "\n".join(lines) + " }"


def asm_kt2() -> str:
    """Calibrated 2-bit channel-axis keys: the units of channels c0 and c1 (words A and B, byte 0 = the 2-bit codes of
    tokens 0-3) -> registers (c0, c1) per token 0-3, level t[code] s + m. One PRMT gathers both units' bytes, and per
    token the two codes become a selector (c_A, c_A + 4, c_B, c_B + 4) that picks both levels' low and high bytes out
    of the table's two words in one PRMT; then one HFMA2 with the scale and zero pairs: 6 instructions a pair. In:
    $8 wA, $9 wB, $10 the scale pair, $11 the zero pair (packed f16x2), $12 / $13 the low and high bytes of levels
    0-3 (`cb_table_words` words 0 and 4)."""
    lines = ["{ .reg .b32 t, y, sl, x, r0, r1, r2, r3;", "prmt.b32 t, $8, $9, 0x0040;"]
    for f in range(4):
        lines += ([f"shr.b32 y, t, {2 * f};"] if f else ["mov.b32 y, t;"]) + [
            "lop3.b32 sl, y, 0x0303, 0, 0xC0;", "shl.b32 x, sl, 4;", "lop3.b32 sl, sl, x, 0x4040, 0xFE;",
            f"prmt.b32 r{f}, $12, $13, sl;", f"fma.rn.f16x2 r{f}, r{f}, $10, $11;"]
    lines += [f"mov.b32 {{${2 * f}, ${2 * f + 1}}}, r{f};" for f in range(4)]
    return "\n".join(lines) + " }"


def asm_kt3() -> str:
    """Calibrated int3 channel-axis keys: the units of channels c0 and c1 (words A and B: byte 0 = the 2-bit fields of
    tokens 0-3, bits 8-11 their plane bits, as `kc_load` hands KC3) -> registers (c0, c1) per token 0-3, level
    t[field | plane bit << 2] s + m. Per token: the two 3-bit codes as selector nibbles 0 and 2, one PRMT for the
    levels' low bytes and one for their high bytes (entries 0-7: table words 0, 1 and 4, 5), one to interleave them,
    one HFMA2. In: $8 wA, $9 wB, $10 the scale pair, $11 the zero pair, $12 / $13 the low bytes of levels 0-3 / 4-7,
    $14 / $15 their high bytes."""
    lines = ["{ .reg .b32 g, y, x, c, sl, lo, hi, r0, r1, r2, r3;", "prmt.b32 g, $8, $9, 0x5410;"]
    for f in range(4):
        lines += ([f"shr.b32 y, g, {2 * f};"] if f else ["mov.b32 y, g;"]) + [
            f"shr.b32 x, g, {6 + f};", "lop3.b32 y, y, 0x00030003, 0, 0xC0;",
            "lop3.b32 c, x, 0x00040004, y, 0xEA;",  # (x & plane) | field: the code in bits 0-2 of each half
            "shr.b32 x, c, 8;", "lop3.b32 sl, c, x, 0, 0xFC;",  # c_B from bits 16-18 to 8-10 (nibble 2)
            "prmt.b32 lo, $12, $13, sl;", "prmt.b32 hi, $14, $15, sl;", f"prmt.b32 r{f}, lo, hi, 0x6240;",
            f"fma.rn.f16x2 r{f}, r{f}, $10, $11;"]
    lines += [f"mov.b32 {{${2 * f}, ${2 * f + 1}}}, r{f};" for f in range(4)]
    return "\n".join(lines) + " }"


def asm_kt4(k: int) -> str:
    """Calibrated int4 channel-axis keys, byte k of the units of channels c0 and c1 (words A and B, low nibble first)
    -> (tok 2k: c0, c1, tok 2k + 1: c0, c1) as KC4, level t[nibble] s + m: the codebooks' 16-entry lookup
    (`_cb_lookup`) of the four nibbles, one HFMA2 per token. In: $4 wA, $5 wB, $6 the scale pair, $7 the zero pair,
    $8..$15 the table words."""
    return "\n".join([_CB_REGS, f"prmt.b32 g, $4, $5, 0x00{4 + k}{k};"] + _cb_lookup("g", "r0", "r1", 8) +
                      ["fma.rn.f16x2 r0, r0, $6, $7;", "fma.rn.f16x2 r1, r1, $6, $7;", "mov.b32 {$0, $1}, r0;",
                       "mov.b32 {$2, $3}, r1; }"])


AKC40, AKC41 = (ttgl.constexpr(asm_kc(KC4, k)) for k in range(2))


def asm_kf(k: int) -> str:
    """`asm_kc` (KC4) without the scale and zero (`C_KF4`): byte k of the code runs of channels c0 and c1 -> (tok 2k:
    c0, c1, tok 2k + 1: c0, c1) as fp16 subnormals, n 2^-24 and (high nibble) 16 n 2^-24. In: $4 wA, $5 wB."""
    return "\n".join(["{ .reg .b32 t, r0, r1;", f"prmt.b32 t, $4, $5, 0x{4 + k}{4 + k}{k}{k};",
                      "lop3.b32 r0, t, 0x000F000F, 0, 0xC0;", "lop3.b32 r1, t, 0x00F000F0, 0, 0xC0;",
                      "mov.b32 {$0, $1}, r0;",
                      "mov.b32 {$2, $3}, r1; }"])


AKF40, AKF41 = (ttgl.constexpr(asm_kf(k)) for k in range(2))
# `asm_kc` (KC2) without the scale and zero (`C_KF2`): tokens 0-3 of channels c0 and c1 as fp16 subnormals, n 2^-24 at
# tokens 0 and 2, 4 n 2^-24 at 1 and 3. In: $8 wA, $9 wB
AKF2 = ttgl.constexpr("\n".join(
    ["{ .reg .b32 t, v, r0, r1, r2, r3;", "prmt.b32 t, $8, $9, 0x4400;", "shr.b32 v, t, 4;",
     "lop3.b32 r0, t, 0x00030003, 0, 0xC0;", "lop3.b32 r1, t, 0x000C000C, 0, 0xC0;",
     "lop3.b32 r2, v, 0x00030003, 0, 0xC0;", "lop3.b32 r3, v, 0x000C000C, 0, 0xC0;"] +
    [f"mov.b32 {{${2 * i}, ${2 * i + 1}}}, r{i};" for i in range(3)] + ["mov.b32 {$6, $7}, r3; }"]))
# a packed f16x2 word -> its two halves
ASM_UNPACK = ttgl.constexpr("mov.b32 {$0, $1}, $2;")
AKC2 = ttgl.constexpr(asm_kc(KC2, 0))
AKC3 = ttgl.constexpr(asm_kc3())
def asm_i3(k: int, asym: bool) -> str:
    """int3, byte k of the 2-bit words A and B and their plane bits (low 16 bits of pA and pB) -> (f0 A, f0 B, f1 A,
    f1 B, ..., f3 A, f3 B), field f = code 4 k + f of A / B: the 2-bit field as Q2's (fields 1 and 3 as 4 c with
    s / 4), its plane bit shifted to just above it. In: $8 wA, $9 wB, $10 pA, $11 pB, $12 sA, $13 sB, $14 sA / 4,
    $15 sB / 4 (asym: $16 mA, $17 mB). Sym offset 4 (the code's middle)."""
    def plane(f: int, r: str) -> list[str]:  # plane bit 4 k + f -> just above the field (bit 2, or 4 for odd f)
        return _plane_bit(r, 4 * k + f, 4 if f & 1 else 2)
    head = ["{ .reg .b32 t, v, pp, x, r0, r1, r2, r3, s1, s4, c0, c1, m1;",
            f"prmt.b32 t, $8, $9, 0x{4 + k}{4 + k}{k}{k};", "shr.b32 v, t, 4;", "prmt.b32 pp, $10, $11, 0x5410;"]
    return "\n".join(head) + "\n" + _asm_2bit_fin(asym, [f"${i}" for i in range(8)], ["r0", "r1", "r2", "r3"],
                                                   ["t", "v"], "$12, $13", "$14, $15", "$16, $17", (4, 16), plane)


AI30, AI31, AI32, AI33 = (ttgl.constexpr(asm_i3(k, False)) for k in range(4))
AJ30, AJ31, AJ32, AJ33 = (ttgl.constexpr(asm_i3(k, True)) for k in range(4))


def asm_cb3(k: int) -> str:
    """3-bit codebook, byte k of the 2-bit words A and B and their plane bits (low 16 bits of pA and pB) -> (f0 A,
    f0 B, ..., f3 A, f3 B) as table entries times s, int3's order. In: $8 wA, $9 wB, $10 pA, $11 pB, $12 sA, $13 sB,
    $14 / $15 the low bytes of entries 0-3 / 4-7, $16 / $17 their high bytes (`cb_table_words` words 0, 1, 4, 5).
    Per field: the 2-bit field of each half and its plane bit just above it, as int3's asm does (without the fp16
    magic), then the two 3-bit codes as selector nibbles 0 and 2 (low bytes) and 1 and 3 (high bytes, shifted by 4),
    one PRMT per byte plane, one LOP3 to merge them: 10-11 instructions per pair of values."""
    lines = ["{ .reg .b32 t, v, pp, x, y, c, sl, sh, lo, hi, s1, r0, r1, r2, r3;",
             f"prmt.b32 t, $8, $9, 0x{4 + k}{4 + k}{k}{k};", "shr.b32 v, t, 4;", "prmt.b32 pp, $10, $11, 0x5410;",
             "mov.b32 s1, {$12, $13};"]
    for f in range(4):
        src, mask = ("t" if f < 2 else "v"), ("0x000C000C" if f & 1 else "0x00030003")
        lines += [f"lop3.b32 c, {src}, {mask}, 0, 0xC0;", *_plane_bit("c", 4 * k + f, 4 if f & 1 else 2)]
        if f & 1:  # the code sits at bits 2-4 of each half
            lines += ["shr.b32 c, c, 2;"]
        lines += ["shr.b32 y, c, 8;", "lop3.b32 sl, c, y, 0x0707, 0xA8;", "shl.b32 sh, sl, 4;",
                  "prmt.b32 lo, $14, $15, sl;", "prmt.b32 hi, $16, $17, sh;",
                  f"lop3.b32 r{f}, lo, hi, 0xFF00FF00, 0xD8;", f"mul.rn.f16x2 r{f}, r{f}, s1;"]
    lines += [f"mov.b32 {{${2 * f}, ${2 * f + 1}}}, r{f};" for f in range(4)]
    return "\n".join(lines) + " }"


AL30, AL31, AL32, AL33 = (ttgl.constexpr(asm_cb3(k)) for k in range(4))


ASM_K_Q2 = ttgl.constexpr(_asm_k2(False))
ASM_K_Q2A = ttgl.constexpr(_asm_k2(True))
# fp4 e2m1 magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6 as fp16 are 0x00, 0x38, 0x3C, 0x3E, 0x40, 0x42, 0x44, 0x46 in the high
# byte over a zero low byte: one PRMT looks up two of them (selector nibbles 1 and 3 = the codes' low 3 bits,
# nibbles 0 and 2 = entry 0, the zero byte); the sign bit is OR-ed in from the code word shifted to bit 15 / 31.
_F4_TABLE = "mov.b32 ta, 0x3E3C3800;\nmov.b32 tb, 0x46444240;"


def _f4_pair(g: str, w: str, lo_shift: int, hi_shift: int, rl: str, rh: str) -> list[str]:
    """Registers rl, rh = (lo nibbles), (hi nibbles) of the two bytes gathered in g's low 16 bits, signed from the
    code word w shifted left by lo_shift / hi_shift (sign bits of the two bytes to bits 15 and 31)."""
    return [f"shl.b32 x, {g}, 4;", "lop3.b32 sl, x, 0x7070, 0, 0xC0;", f"lop3.b32 sh, {g}, 0x7070, 0, 0xC0;",
            f"prmt.b32 {rl}, ta, tb, sl;", f"prmt.b32 {rh}, ta, tb, sh;",
            f"shl.b32 x, {w}, {lo_shift};", f"lop3.b32 {rl}, {rl}, x, 0x80008000, 0xF8;"] + (
        [f"shl.b32 x, {w}, {hi_shift};", f"lop3.b32 {rh}, {rh}, x, 0x80008000, 0xF8;"] if hi_shift else
        [f"lop3.b32 {rh}, {rh}, {w}, 0x80008000, 0xF8;"])


# fp4 keys: word -> registers (lo b0, lo b2), (hi b0, hi b2), (lo b1, lo b3), (hi b1, hi b3) (Q4's order), times s.
# In: $8 w, $9 s (fp16).
ASM_K_F4 = ttgl.constexpr("\n".join(
    ["{ .reg .b32 ta, tb, g, x, sl, sh, r0, r1, r2, r3, s1;", _F4_TABLE, "mov.b32 s1, {$9, $9};",
     "prmt.b32 g, $8, 0, 0x0020;"] + _f4_pair("g", "$8", 12, 8, "r0", "r1") +
    ["prmt.b32 g, $8, 0, 0x0031;"] + _f4_pair("g", "$8", 4, 0, "r2", "r3") +
    [f"mul.rn.f16x2 r{i}, r{i}, s1;" for i in range(4)] +
    ["mov.b32 {$0, $1}, r0;", "mov.b32 {$2, $3}, r1;", "mov.b32 {$4, $5}, r2;", "mov.b32 {$6, $7}, r3; }"]))


def _asm_v_f4(k: int) -> str:
    """fp4 values, byte k of words A and B -> (lo A, lo B, hi A, hi B), Q4's order. In: $4 wA, $5 wB, $6 sA, $7 sB."""
    return "\n".join(
        ["{ .reg .b32 ta, tb, g, t, x, sl, sh, r0, r1, s1;", _F4_TABLE, "mov.b32 s1, {$6, $7};",
         f"prmt.b32 g, $4, $5, 0x00{4 + k}{k};", f"prmt.b32 t, $4, $5, 0x{4 + k}{4 + k}{k}{k};"] +
        _f4_pair("g", "t", 12, 8, "r0", "r1") +
        ["mul.rn.f16x2 r0, r0, s1;", "mul.rn.f16x2 r1, r1, s1;", "mov.b32 {$0, $1}, r0;", "mov.b32 {$2, $3}, r1; }"])


AVE0, AVE1, AVE2, AVE3 = (ttgl.constexpr(_asm_v_f4(k)) for k in range(4))
def cb_table_words(values) -> list[int]:
    """A 16-entry codebook as the 8 table words its asm takes: the low bytes of entries 0-3, 4-7, 8-11, 12-15, then
    their high bytes (entries as fp16)."""
    import numpy as np
    h = np.asarray(values, dtype=np.float32).astype(np.float16).view(np.uint16).astype(np.uint32)
    lo, hi = h & 0xFF, h >> 8
    word = lambda b, i: int(b[i] | b[i + 1] << 8 | b[i + 2] << 16 | b[i + 3] << 24)  # noqa: E731
    return [word(lo, i) for i in (0, 4, 8, 12)] + [word(hi, i) for i in (0, 4, 8, 12)]


def _cb_lookup(g: str, r_lo: str, r_hi: str, t0: int) -> list[str]:
    """Registers r_lo, r_hi = the table entries of the four codes in g's low 16 bits (nibbles n0..n3 = the low and
    high nibbles of two bytes): r_lo = (entry n0, entry n2), r_hi = (entry n1, entry n3), fp16 pairs. Table words in
    $t0..$t0+7 (`cb_table_words`). One PRMT per table half looks up the low bytes of entries n & 7 of all four codes
    at once (bit 3 cleared, so it never sign-fills), one PRMT with selector nibbles i + 4 * bit3(n_i) merges the
    halves; the same for the high bytes; two PRMTs interleave low and high bytes into the fp16 pairs. 11 instructions
    for four values (llama.cpp's `get_int_from_table_16` does the int8 half of this for its iq4_nl dot products)."""
    la0, la1, lb0, lb1, ha0, ha1, hb0, hb1 = (f"${t0 + i}" for i in range(8))
    return [f"lop3.b32 sl, {g}, 0x7777, 0, 0xC0;", f"shr.b32 x, {g}, 1;", "lop3.b32 t, x, 0x4444, 0x3210, 0xEA;",
            f"prmt.b32 xa, {la0}, {la1}, sl;", f"prmt.b32 xb, {lb0}, {lb1}, sl;", "prmt.b32 xa, xa, xb, t;",
            f"prmt.b32 ya, {ha0}, {ha1}, sl;", f"prmt.b32 yb, {hb0}, {hb1}, sl;", "prmt.b32 ya, ya, yb, t;",
            f"prmt.b32 {r_lo}, xa, ya, 0x6240;", f"prmt.b32 {r_hi}, xa, ya, 0x7351;"]


_CB_REGS = "{ .reg .b32 g, x, sl, t, xa, ya, xb, yb, r0, r1, r2, r3, s1;"
# codebook keys: word -> Q4's register order, times s. In: $8 w, $9 s, $10..$17 the table words.
ASM_K_CB = ttgl.constexpr("\n".join(
    [_CB_REGS, "mov.b32 s1, {$9, $9};", "prmt.b32 g, $8, 0, 0x0020;"] + _cb_lookup("g", "r0", "r1", 10) +
    ["prmt.b32 g, $8, 0, 0x0031;"] + _cb_lookup("g", "r2", "r3", 10) +
    [f"mul.rn.f16x2 r{i}, r{i}, s1;" for i in range(4)] +
    ["mov.b32 {$0, $1}, r0;", "mov.b32 {$2, $3}, r1;", "mov.b32 {$4, $5}, r2;", "mov.b32 {$6, $7}, r3; }"]))


def _asm_v_cb(k: int) -> str:
    """Codebook values, byte k of words A and B -> (lo A, lo B, hi A, hi B). In: $4 wA, $5 wB, $6 sA, $7 sB,
    $8..$15 the table words."""
    return "\n".join([_CB_REGS, "mov.b32 s1, {$6, $7};", f"prmt.b32 g, $4, $5, 0x00{4 + k}{k};"] +
                      _cb_lookup("g", "r0", "r1", 8) +
                      ["mul.rn.f16x2 r0, r0, s1;", "mul.rn.f16x2 r1, r1, s1;", "mov.b32 {$0, $1}, r0;",
                       "mov.b32 {$2, $3}, r1; }"])


AVC0, AVC1, AVC2, AVC3 = (ttgl.constexpr(_asm_v_cb(k)) for k in range(4))
# calibrated channel-axis keys (asm_kt2 / asm_kt3 / asm_kt4 above; the 16-entry lookup is defined here)
AKT2 = ttgl.constexpr(asm_kt2())
AKT3 = ttgl.constexpr(asm_kt3())
AKT40, AKT41 = (ttgl.constexpr(asm_kt4(k)) for k in range(2))


def _cb2_lookup(g: str, regs: list[str], lo: str, hi: str) -> list[str]:
    """2-bit codebook: registers regs[f] = (entry of field f of byte 0 of g, of field f of byte 1), f = 0..3. $lo / $hi:
    the low and high bytes of entries 0-3 (`cb_table_words` words 0 and 4). A PRMT selector nibble holds two fields;
    its low three bits index the table passed twice (bytes 0-3 and 4-7 alike), so the upper field's low bit is
    harmless and only bit 3 (sign fill) is cleared: g & 0x7777 looks up fields 0 and 2 of both bytes, (g >> 2) &
    0x7777 fields 1 and 3, the low and high bytes each with one PRMT; two PRMTs interleave them per field pair."""
    return [f"lop3.b32 sa, {g}, 0x7777, 0, 0xC0;", f"shr.b32 x, {g}, 2;", "lop3.b32 sb, x, 0x7777, 0, 0xC0;",
            f"prmt.b32 la, {lo}, {lo}, sa;", f"prmt.b32 ha, {hi}, {hi}, sa;",
            f"prmt.b32 lb, {lo}, {lo}, sb;", f"prmt.b32 hb, {hi}, {hi}, sb;",
            f"prmt.b32 {regs[0]}, la, ha, 0x6240;", f"prmt.b32 {regs[1]}, lb, hb, 0x6240;",
            f"prmt.b32 {regs[2]}, la, ha, 0x7351;", f"prmt.b32 {regs[3]}, lb, hb, 0x7351;"]


_CB2_REGS = "{ .reg .b32 g, x, sa, sb, la, ha, lb, hb, s1, "
# 2-bit codebook keys: word -> int2's register order (bytes (0, 2) fields 0-3, then (1, 3)), times s.
# In: $16 w, $17 s, $18 / $19 the table's low-byte and high-byte words.
ASM_K_CB2 = ttgl.constexpr("\n".join(
    [_CB2_REGS + ", ".join(f"r{j}" for j in range(8)) + ";", "mov.b32 s1, {$17, $17};", "prmt.b32 g, $16, 0, 0x0020;"]
    + _cb2_lookup("g", ["r0", "r1", "r2", "r3"], "$18", "$19") + ["prmt.b32 g, $16, 0, 0x0031;"]
    + _cb2_lookup("g", ["r4", "r5", "r6", "r7"], "$18", "$19") + [f"mul.rn.f16x2 r{j}, r{j}, s1;" for j in range(8)]
    + [f"mov.b32 {{${2 * j}, ${2 * j + 1}}}, r{j};" for j in range(8)]) + " }")


def _asm_v_cb2(k: int) -> str:
    """2-bit codebook values, byte k of words A and B -> (f0 A, f0 B, f1 A, f1 B, f2 A, f2 B, f3 A, f3 B), int2's
    order. In: $8 wA, $9 wB, $10 sA, $11 sB, $12 / $13 the table's low-byte and high-byte words."""
    return "\n".join([_CB2_REGS + "r0, r1, r2, r3;", "mov.b32 s1, {$10, $11};", f"prmt.b32 g, $8, $9, 0x00{4 + k}{k};"]
                     + _cb2_lookup("g", ["r0", "r1", "r2", "r3"], "$12", "$13")
                     + [f"mul.rn.f16x2 r{j}, r{j}, s1;" for j in range(4)]
                     + [f"mov.b32 {{${2 * j}, ${2 * j + 1}}}, r{j};" for j in range(4)]) + " }"


AVL0, AVL1, AVL2, AVL3 = (ttgl.constexpr(_asm_v_cb2(k)) for k in range(4))


# scale bytes -> fp16: e8m0 E as the float32 2^(E - 127) (bits E << 23; 255 -> inf here, NaN by the caller),
# rounded to fp16 (past 2^15: inf, below 2^-24: 0, as an fp16 operand must); e4m3 exactly by the hardware cvt
ASM_S_E8M0 = ttgl.constexpr("{ .reg .b32 f; shl.b32 f, $1, 23; cvt.rn.f16.f32 $0, f; }")
ASM_S_E4M3 = ttgl.constexpr("{ .reg .b32 r; .reg .b16 lo, hi; cvt.rn.f16x2.e4m3x2 r, $1; mov.b32 {lo, hi}, r; "
                            "mov.b16 $0, lo; }")


@gluon.jit
def scale16(x, SD: ttgl.constexpr):
    """Stored group scales as fp16 (SD: `SCALE_DTYPES` code): fp16 as loaded; e8m0 / e4m3 bytes converted."""
    if SD == 1:
        h = ttgl.inline_asm_elementwise(ASM_S_E8M0, "=h,r", [x.to(ttgl.int32)], dtype=ttgl.float16, is_pure=True,
                                        pack=1)
        return ttgl.where(x == 255, float("nan"), h)
    elif SD == 2:
        return ttgl.inline_asm_elementwise(ASM_S_E4M3, "=h,h", [x.to(ttgl.int16)], dtype=ttgl.float16, is_pure=True,
                                           pack=1)
    else:
        return x


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
    text = {Q4: _asm_v4(False), Q4A: _asm_v4(True), I8: _asm_v8(False), I8A: _asm_v8(True), Q2: _asm_v2(False),
            Q2A: _asm_v2(True)}[codec]
    return text.replace("SEL", f"0x{4 + k}{4 + k}{k}{k}")


AVQ0, AVQ1, AVQ2, AVQ3 = (ttgl.constexpr(asm_v(Q4, k)) for k in range(4))
AVA0, AVA1, AVA2, AVA3 = (ttgl.constexpr(asm_v(Q4A, k)) for k in range(4))
AVB0, AVB1, AVB2, AVB3 = (ttgl.constexpr(asm_v(I8A, k)) for k in range(4))
AVI0, AVI1, AVI2, AVI3 = (ttgl.constexpr(asm_v(I8, k)) for k in range(4))
AVF0, AVF1, AVF2, AVF3 = (ttgl.constexpr(asm_v(F8, k)) for k in range(4))
AVT0, AVT1, AVT2, AVT3 = (ttgl.constexpr(asm_v(Q2, k)) for k in range(4))
AVU0, AVU1, AVU2, AVU3 = (ttgl.constexpr(asm_v(Q2A, k)) for k in range(4))


def asm_np(codec: int, k: int) -> str:
    """int5 / int6 (`NIBP`), byte k of the nibble words A and B -> (lo A, lo B, hi A, hi B) as Q4's values, each nibble
    with its high-plane bits OR-ed in above it: 1024 + c (low nibbles) or 1024 + 16 c (high nibbles, meeting s / 16)
    before the offset and scale. In: $4 wA, $5 wB, $6 pA, $7 pB (each word's high plane shifted so that its first
    channel's bits are bit 0), $8 sA, $9 sB, $10 sA / 16, $11 sB / 16 (asym: $12 mA, $13 mB). Sequential planes:
    nibble f of byte k is channel 2 k + f of the word, plane bits PB (2 k + f); GGML's (q5_0): the low nibble of byte
    k is channel k of the word's block, its plane bit k; the high nibble channel k + 16, plane bit k + 16 (the high
    halves of pA / pB). Sym offsets 2^(b-1) (q5_0: 16)."""
    bits = 6 if codec in (I6, I6A) else 5
    asym, ggml = codec in ASYM, codec in (I5G, I5GA)
    pb = bits - 4
    half = 0 if asym else 1 << (bits - 1)
    cl, ch = 0xE400 + half, 0xE400 + 16 * half
    fin = "fma.rn.f16x2 {r}, {r}, {s}, m1;" if asym else "mul.rn.f16x2 {r}, {r}, {s};"
    lines = ["{ .reg .b32 t, lo, hi, pp, pq, x, s1, s16, cl, ch, m1;", f"mov.b32 cl, 0x{cl:04X}{cl:04X};",
             f"mov.b32 ch, 0x{ch:04X}{ch:04X};", "mov.b32 s1, {$8, $9};", "mov.b32 s16, {$10, $11};"] + (
        ["mov.b32 m1, {$12, $13};"] if asym else []) + [
        f"prmt.b32 t, $4, $5, 0x{4 + k}{4 + k}{k}{k};",
        "lop3.b32 lo, t, 0x000F000F, 0x64006400, 0xEA;", "lop3.b32 hi, t, 0x00F000F0, 0x64006400, 0xEA;",
        "prmt.b32 pp, $6, $7, 0x5410;"]
    if ggml:
        lines += ["prmt.b32 pq, $6, $7, 0x7632;"]
        ins = [("lo", "pp", k, 4), ("hi", "pq", k, 8)]
    else:
        ins = [("lo", "pp", pb * 2 * k, 4), ("hi", "pp", pb * (2 * k + 1), 8)]
    mask = (1 << pb) - 1
    for r, src, bit, top in ins:  # plane bits bit .. bit + pb - 1 of each half of src -> bits top .. of r's half
        sh = top - bit
        lines += [f"shl.b32 x, {src}, {sh};" if sh > 0 else (f"shr.b32 x, {src}, {-sh};" if sh < 0 else
                                                              f"mov.b32 x, {src};"),
                  f"lop3.b32 {r}, {r}, x, 0x{mask << top:04X}{mask << top:04X}, 0xF8;"]
    lines += ["add.rn.f16x2 lo, lo, cl;", "add.rn.f16x2 hi, hi, ch;", fin.format(r="lo", s="s1"),
              fin.format(r="hi", s="s16"), "mov.b32 {$0, $1}, lo;", "mov.b32 {$2, $3}, hi; }"]
    return "\n".join(lines)


AN50, AN51, AN52, AN53 = (ttgl.constexpr(asm_np(I5, k)) for k in range(4))
AM50, AM51, AM52, AM53 = (ttgl.constexpr(asm_np(I5A, k)) for k in range(4))
AN60, AN61, AN62, AN63 = (ttgl.constexpr(asm_np(I6, k)) for k in range(4))
AM60, AM61, AM62, AM63 = (ttgl.constexpr(asm_np(I6A, k)) for k in range(4))
AG50, AG51, AG52, AG53 = (ttgl.constexpr(asm_np(I5G, k)) for k in range(4))
AH50, AH51, AH52, AH53 = (ttgl.constexpr(asm_np(I5GA, k)) for k in range(4))


# ---- loads ---------------------------------------------------------------------------------------------
# page-tensor offsets built as (page base + the lane parts) + the register parts, so the compiler folds each
# register's constant into its load's immediate offset (`tok_rows`' REG, `kc_load`); KVLAB_GLUON_FOLD_ROWS=0 builds them
# in one sum as before (session 27's A/B)
FOLD_ROWS = ttgl.constexpr(os.environ.get("KVLAB_GLUON_FOLD_ROWS", "1") != "0")


@gluon.jit
def tile_tok(n, TW: ttgl.constexpr, PERM: ttgl.constexpr):
    """Token (within a warp's TW) of tile position n: n itself, or with PERM (channel-axis keys) the order in
    which the thread of lane // 4 = g holds the TW / 8 consecutive tokens TW / 8 g + j at positions g + 8 j."""
    if PERM:
        return (TW // 8) * (n % 8) + n // 8
    else:
        return n


@gluon.jit
def wide(a, b):
    """int64 a * b of int32 tensors a and b in one mul.wide.s32 (int64 casts first cost a 64-bit multiply)."""
    return ttgl.inline_asm_elementwise("mul.wide.s32 $0, $1, $2;", "=l,r,r", [a, b], dtype=ttgl.int64, is_pure=True,
                                      pack=1)


@gluon.jit
def mload(ptr, m, other, MASK: ttgl.constexpr):
    """`ttgl.load(ptr, mask=m, other=other)`, or unmasked where the caller knows every element is in range (MASK
    False: a tile whose tokens all lie before `hi`, so no mask is computed)."""
    if MASK:
        return ttgl.load(ptr, mask=m, other=other)
    else:
        return ttgl.load(ptr)


@gluon.jit
def _np_words(nl, wi, CODEC: ttgl.constexpr, G: ttgl.constexpr, SPAN: ttgl.constexpr):
    """int5 / int6 (`NIBP`): for the nibble bytes nl + 4 wi .. + 3 of a row (counted without the high plane; nl, the
    lane part, a multiple of 4; wi, the register part, a word index), the row word that holds them, the row word of
    their high plane, the shift that brings their first channel's plane bits to bit 0, and their group. A group is
    G / 8 nibble words then PB G / 32 plane words (sequential), or GGML's q5 block: one plane word (qh), then 4 nibble
    words (G = 32). The word offsets come out as (lane part) + (register part), the latter a constant of each register
    that the compiler folds into the load's immediate offset (`tok_rows`' REG). SPAN: the words run past one group
    (keys at D 256 with groups of 32; nl then a multiple of G / 2)."""
    PB: ttgl.constexpr = 2 if CODEC == C_I6 or CODEC == C_I6A else 1
    GW: ttgl.constexpr = (4 + PB) * G // 32  # words per group
    if CODEC == C_I5G or CODEC == C_I5GA:  # low nibbles: channels j.. of the group (plane bits j..), high: j + 16..
        gl = nl // 16
        if SPAN:
            gr = (4 * wi) // 16
            jr = (4 * wi) % 16
            return (GW * gl) + (GW * gr + 1 + jr // 4), (GW * gl) + GW * gr, jr + 0 * nl, gl + gr
        else:  # (nl % 16 + 4 wi < 16)
            jl = nl % 16
            return (GW * gl + 1 + jl // 4) + wi, (GW * gl) + 0 * wi, jl + 4 * wi, gl + 0 * wi
    else:
        cl = 2 * nl  # first channel of the lane part
        gl = cl // G
        if SPAN:  # (cl % G == 0)
            cr = 8 * wi
            gr = cr // G
            o = cr % G
            return (GW * gl) + (GW * gr + o // 8), (GW * gl) + (GW * gr + G // 8 + (PB * o) // 32), \
                (PB * o) % 32 + 0 * nl, gl + gr
        else:  # (the lane's channels and its words' lie in one group; (PB ol) % 32 + 8 PB wi < 32 or ol = 0)
            ol = cl % G
            return (GW * gl + ol // 8) + wi, (GW * gl + G // 8 + (PB * ol) // 32) + (8 * PB * wi) // 32, \
                (PB * ol + 8 * PB * wi) % 32, gl + 0 * wi


@gluon.jit
def tok_rows(IDX, t0, hi, hk, c0, c1, ROW: ttgl.constexpr, P: ttgl.constexpr, TW: ttgl.constexpr,
             N: ttgl.constexpr, STEP: ttgl.constexpr, L2: ttgl.constexpr, NW: ttgl.constexpr,
             PERM: ttgl.constexpr = False, PS: ttgl.constexpr = 1, REG: ttgl.constexpr = 0,
             MASK: ttgl.constexpr = True):
    """[NW, N] (layout L2) int64 offsets of the rows of the tokens at positions t0 + w * TW + STEP * n (through
    `tile_tok`) in a page tensor with strides PS c0 (page; PS 16 keeps the offsets' alignment known to the
    compiler, so row loads stay vectorized), c1 (head) and ROW (row; pages are dense within a (page, head) tile). t0 % TW == 0 and P % 16 == 0, so a warp's tokens lie in at most two pages, looked up
    once per warp. A page past `hi` reads as page 0 (those scores are masked, those V scales zeroed); MASK False: the
    caller's tile lies before `hi` (the page lookups unmasked).
    REG: the position bits that L2 keeps in registers (the rest are lane bits, all below 8). With it (and P a
    multiple of TW or TW of P) each offset is built as (page base + the lane part) + the register part, the last a
    constant of each register, so the compiler folds it into the load's immediate offset: one 64-bit address a
    thread a tensor, not one a register (q4_0: 417 -> 396 loop instructions a 16-token tile, `FOLD_ROWS`)."""
    tb = t0 + ttgl.arange(0, NW, layout=ttgl.SliceLayout(1, L2)) * TW  # [NW] first token of each warp
    pos = ttgl.arange(0, N, layout=ttgl.SliceLayout(0, L2)) * STEP
    r0 = tb % P  # row of the warp's first token in its page
    pg = mload(IDX + tb // P, tb < hi, 0, MASK)
    base = wide(pg, pg * 0 + c0) * PS + (hk * c1 + r0 * ROW)  # strides and in-page offsets fit int32 (`run` checks)
    if FOLD_ROWS and REG > 0 and (P % TW == 0 or TW % P == 0):
        # a bit permutation (`tile_tok`) of disjoint bit fields: token = lane part + register part
        pr = pos & REG
        tl_ = tile_tok(pos - pr, TW, PERM)
        tr = tile_tok(pr, TW, PERM)
        if P % TW == 0:
            return (base[:, None] + (tl_ * ROW)[None, :]) + (tr * ROW)[None, :]
        else:  # TW = 2 P (P = 16, TW = 32): r0 = 0 and the lane part stays below P, so the register part's token
            # bit log2(P) picks the page
            nxt = (tb // P + 1) * P
            pg1 = mload(IDX + tb // P + 1, nxt < hi, 0, MASK)
            base1 = wide(pg1, pg1 * 0 + c0) * PS + hk * c1
            jr = tr // P
            bsel = ttgl.where(jr[None, :] == 0, base[:, None], base1[:, None])
            return (bsel + (tl_ * ROW)[None, :]) + ((tr - jr * P) * ROW)[None, :]
    n = tile_tok(pos, TW, PERM)
    if P % TW == 0:  # one page per warp and tile
        return base[:, None] + (n * ROW)[None, :]
    else:  # e.g. P = 16, TW = 32: tokens from row P - r0 on are rows 0.. of the next page
        nxt = (tb // P + 1) * P
        pg1 = mload(IDX + tb // P + 1, nxt < hi, 0, MASK)
        base1 = wide(pg1, pg1 * 0 + c0) * PS + (hk * c1 + (r0 - P) * ROW)
        return ttgl.where((r0[:, None] + n[None, :]) < P, base[:, None], base1[:, None]) + (n * ROW)[None, :]


@gluon.jit
def k_load(KC, KS, KZ, IDX, t0, hi, hk, kc0, kc1, ks0, ks1, CODEC: ttgl.constexpr, WK: ttgl.constexpr,
           G: ttgl.constexpr, P: ttgl.constexpr, TW: ttgl.constexpr, KW: ttgl.constexpr, NW: ttgl.constexpr,
           D: ttgl.constexpr, PS: ttgl.constexpr = 1, SD: ttgl.constexpr = 0, MASK: ttgl.constexpr = True,
           KX: ttgl.constexpr = None, KA: ttgl.constexpr = None):
    """Raw K code words [NW, WK, r, TW] (int32), a second word tensor (int3: the plane word beside each 2-bit word;
    else the words again), scales and zeros [NW, r, TW] (fp16; 1 / 0 where the codec has none) of tokens
    t0 + w * TW + [0, TW) of warp w, read unmasked (rows past `hi` are page 0 or unused rows of the last page; the
    kernel scores them -inf). Zeros share the scales' strides. C_Q4G (keys by groups): word r of each group, then
    the scales [NW, TW, D / 32] in layout KX (the scores' rows, every group in registers) and, for the offsets' MMA,
    its A fragment [NW, TW, 16] (layout KA): the scale of group k // 2 at column k < 2 D / 32, else 0."""
    if CODEC == C_Q4G:
        return _k_load_groups(KC, KS, KZ, IDX, t0, hi, hk, kc0, kc1, ks0, ks1, CODEC, WK, G, P, TW, KW, NW, D, PS, SD,
                              MASK, KX, KA)
    else:
        return _k_load_rows(KC, KS, KZ, IDX, t0, hi, hk, kc0, kc1, ks0, ks1, CODEC, WK, G, P, TW, KW, NW, D, PS, SD,
                            MASK, KX, KA)


@gluon.jit
def _k_load_groups(KC, KS, KZ, IDX, t0, hi, hk, kc0, kc1, ks0, ks1, CODEC: ttgl.constexpr, WK: ttgl.constexpr,
                   G: ttgl.constexpr, P: ttgl.constexpr, TW: ttgl.constexpr, KW: ttgl.constexpr, NW: ttgl.constexpr,
                   D: ttgl.constexpr, PS: ttgl.constexpr = 1, SD: ttgl.constexpr = 0, MASK: ttgl.constexpr = True,
                   KX: ttgl.constexpr = None, KA: ttgl.constexpr = None):
    """`k_load` for keys by groups (`C_Q4G`): thread-row r reads word r of each 32-channel group (words r, 4 + r, ..;
    one 4-byte load a group, the group's offset folded into the load's immediate)."""
    L3: ttgl.constexpr = ttgl.SliceLayout(3, KW)
    wi = ttgl.arange(0, WK, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(2, L3)))
    r = ttgl.arange(0, 4, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(1, L3)))
    KREG: ttgl.constexpr = (TW - 1) & ~7  # token bits 3 (, 4) of K's layouts lie in registers
    NG: ttgl.constexpr = D // 32
    rows = tok_rows(IDX, t0, hi, hk, kc0, kc1, 4 * WK, P, TW, TW, 1, ttgl.SliceLayout(1, ttgl.SliceLayout(2, KW)),
                    NW, False, PS, KREG, MASK)
    w = ttgl.load(KC + rows[:, None, None, :] + (4 * wi[None, :, None] + r[None, None, :])[:, :, :, None])
    SX: ttgl.constexpr = ttgl.SliceLayout(2, KX)
    gx = ttgl.arange(0, NG, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(1, KX)))
    sx = tok_rows(IDX, t0, hi, hk, ks0, ks1, NG, P, TW, TW, 1, SX, NW, False, PS, KREG, MASK)
    s = ttgl.load(KS + sx[:, :, None] + gx[None, None, :])  # [NW, TW, NG]
    SA: ttgl.constexpr = ttgl.SliceLayout(2, KA)
    ka = ttgl.arange(0, 16, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(1, KA)))
    sa = tok_rows(IDX, t0, hi, hk, ks0, ks1, NG, P, TW, TW, 1, SA, NW, False, PS, KREG, MASK)
    m = ttgl.load(KS + sa[:, :, None] + (ka // 2)[None, None, :], mask=(ka < 2 * NG)[None, None, :],
                  other=0.0)  # [NW, TW, 16]: column k the scale of group k // 2 (k < 2 NG), else 0
    return w, w, s, m


@gluon.jit
def _k_load_rows(KC, KS, KZ, IDX, t0, hi, hk, kc0, kc1, ks0, ks1, CODEC: ttgl.constexpr, WK: ttgl.constexpr,
                 G: ttgl.constexpr, P: ttgl.constexpr, TW: ttgl.constexpr, KW: ttgl.constexpr, NW: ttgl.constexpr,
                 D: ttgl.constexpr, PS: ttgl.constexpr = 1, SD: ttgl.constexpr = 0, MASK: ttgl.constexpr = True,
                 KX: ttgl.constexpr = None, KA: ttgl.constexpr = None):
    """`k_load` for every other codec: thread-row r reads the row's words WK r .. WK r + WK - 1."""
    L3: ttgl.constexpr = ttgl.SliceLayout(3, KW)
    wi = ttgl.arange(0, WK, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(2, L3)))
    r = ttgl.arange(0, 4, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(1, L3)))
    KREG: ttgl.constexpr = (TW - 1) & ~7  # token bits 3 (, 4) of K's layouts lie in registers
    I3ANY: ttgl.constexpr = CODEC == C_I3 or CODEC == C_I3A or CODEC == C_CB3
    NP: ttgl.constexpr = 2 if CODEC == C_I6 or CODEC == C_I6A else (1 if CODEC == C_I5 or CODEC == C_I5A or
                                                                     CODEC == C_I5G or CODEC == C_I5GA else 0)
    # (int5 / int6: bits per channel of the high plane)
    RW: ttgl.constexpr = 3 * D // 32 if I3ANY else ((4 + NP) * D // 32 if NP else 4 * WK)  # words per row
    NPA: ttgl.constexpr = CODEC == C_I5A or CODEC == C_I6A or CODEC == C_I5GA
    word = (WK * r[None, None, :] + wi[None, :, None])[:, :, :, None]  # [1, wi, r, 1]
    if NP:  # word wi of thread-row r: the row's nibble bytes n0 = D / 8 r + 4 wi .. n0 + 3 (high plane not counted)
        word, pword, psh, gi = _np_words((D // 8) * r[None, None, :], wi[None, :, None], CODEC, G, D // 4 > G)
        word = word[:, :, :, None]
    if I3ANY:  # word wi of thread-row r holds the 16 channels from c = D / 4 r + 16 wi on, at offset o of group gi
        # (a group's 3 G / 32 words: G / 16 2-bit words, then G / 32 plane words)
        c = (D // 4) * r[None, None, :] + 16 * wi[None, :, None]  # [1, wi, r]
        gi = c // G
        o = c % G
        word = ((3 * G // 32) * gi + o // 16)[:, :, :, None]
        pword = ((3 * G // 32) * gi + G // 16 + o // 32)[:, :, :, None]
    rows = tok_rows(IDX, t0, hi, hk, kc0, kc1, RW, P, TW, TW, 1, ttgl.SliceLayout(1, ttgl.SliceLayout(2, KW)), NW,
                    False, PS, KREG, MASK)
    w = ttgl.load(KC + rows[:, None, None, :] + word)
    if I3ANY:  # the plane word of each 2-bit word [NW, wi, r, TW], shifted to that word's first channel
        w2 = ttgl.load(KC + rows[:, None, None, :] + pword) >> (o % 32)[:, :, :, None]
    elif NP:  # the high plane of each nibble word, shifted to that word's first channel
        w2 = ttgl.load(KC + rows[:, None, None, :] + pword[:, :, :, None]) >> psh[:, :, :, None]
    else:
        w2 = w
    LS: ttgl.constexpr = ttgl.SliceLayout(1, KW)
    m = ttgl.full([NW, 4, TW], 0.0, ttgl.float16, layout=LS)
    if CODEC == C_F8:
        s = ttgl.full([NW, 4, TW], 1.0, ttgl.float16, layout=LS)
    elif D // 4 > G:  # a thread-row's channels span groups: a scale (and zero) per code word
        srows = tok_rows(IDX, t0, hi, hk, ks0, ks1, D // G, P, TW, TW, 1,
                         ttgl.SliceLayout(1, ttgl.SliceLayout(2, KW)), NW, False, PS, KREG, MASK)
        GB: ttgl.constexpr = G * 16 * WK // D  # bytes per group (a thread-row holds 4 WK bytes of D / 4 channels)
        sg = (4 * WK * r[None, None, :] + 4 * wi[None, :, None]) // GB  # [1, wi, r]: the group of each word
        if I3ANY or NP:  # int3 / lm3 / int5 / int6: the group of the word's first channel
            sg = gi
        s = scale16(ttgl.load(KS + srows[:, None, None, :] + sg[:, :, :, None]), SD)  # [NW, wi, r, TW]
        if CODEC == C_Q4A or CODEC == C_I8A or CODEC == C_Q2A or CODEC == C_I3A or NPA:
            m = ttgl.load(KZ + srows[:, None, None, :] + sg[:, :, :, None])
        else:
            m = ttgl.full([NW, WK, 4, TW], 0.0, ttgl.float16, layout=KW)
    else:
        rs = ttgl.arange(0, 4, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(2, LS)))
        srows = tok_rows(IDX, t0, hi, hk, ks0, ks1, D // G, P, TW, TW, 1, ttgl.SliceLayout(1, LS), NW, False, PS,
                         KREG, MASK)
        rs = rs * (D // 4) // G  # the group of the thread's D / 4 channels
        s = scale16(ttgl.load(KS + srows[:, None, :] + rs[None, :, None]), SD)
        if CODEC == C_Q4A or CODEC == C_I8A or CODEC == C_Q2A or CODEC == C_I3A or NPA:
            m = ttgl.load(KZ + srows[:, None, :] + rs[None, :, None])
    return w, w2, s, m


@gluon.jit
def kc_load(KC, KS, KZ, IDX, t0, hi, hk, kc0, kc1, ks0, ks1, CODEC: ttgl.constexpr, G: ttgl.constexpr,
            P: ttgl.constexpr, TW: ttgl.constexpr, KCL: ttgl.constexpr, NW: ttgl.constexpr, D: ttgl.constexpr,
            PS: ttgl.constexpr = 1, MASK: ttgl.constexpr = True):
    """Channel-axis keys (pages [N, Hk, P / G, D, G bits / 8]; TW = 32, G % TW == 0, so a warp's tile is a
    quarter, half or all of one token group of one page): per thread (r = lane % 4, g = lane // 4) and channel
    pair x, the code units (int4: 2 bytes, int2: 1 byte; KC strides in those units) of channels
    c0 = D / 4 r + 2 x and c0 + 1 that hold tokens 4 g .. 4 g + 3 of the warp's tile, and the pairs' scales and
    zeros as packed f16x2 words (KS / KZ: int32 views, strides in words): four [NW, X, r, g] int32 tensors."""
    X: ttgl.constexpr = D // 8
    # code units per channel per token group (4 tokens per unit: 2 bytes or 1; int3: the 2-bit plane's G / 4 bytes,
    # then the 1-bit plane's G / 8)
    PL3: ttgl.constexpr = CODEC == C_KC3 or CODEC == C_KT3  # int3: a 1-bit plane after the 2-bit one
    RU: ttgl.constexpr = 3 * G // 8 if PL3 else G // 4
    L3: ttgl.constexpr = ttgl.SliceLayout(3, KCL)
    x = ttgl.arange(0, X, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(2, L3)))
    r = ttgl.arange(0, 4, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(1, L3)))
    g = ttgl.arange(0, 8, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(1, ttgl.SliceLayout(2, KCL))))
    LW: ttgl.constexpr = ttgl.SliceLayout(1, ttgl.SliceLayout(2, L3))
    tb = t0 + ttgl.arange(0, NW, layout=LW) * TW  # [NW] first token of each warp's tile
    pg = mload(IDX + tb // P, tb < hi, 0, MASK)
    gi = (tb % P) // G  # token group in the page
    base = wide(pg, pg * 0 + kc0) * PS + (hk * kc1 + gi * (D * RU) + (tb % G) // 4)
    # the first channel of pair x of thread-row r is D / 4 r + 2 x: offsets are built as (page base + the lane
    # parts) + the pair's part, a constant of each register the compiler folds into the load's immediate offset
    # (`tok_rows`' REG)
    if FOLD_ROWS:
        lan = (base[:, None, None] + ((D // 4) * RU) * r[None, None, :])[:, :, :, None] + g[None, None, None, :]
        xo = ((2 * RU) * x[None, :, None])[:, :, :, None]  # [1, X, 1, 1]
    else:
        pair = (D // 4) * r[None, None, :] + 2 * x[None, :, None]  # [1, X, 4] first channel of the pair
        lan = (base[:, None, None] + pair * RU)[:, :, :, None] + g[None, None, None, :]
        xo = 0
    off = lan + xo
    wa = ttgl.load(KC + off).to(ttgl.int32)
    wb = ttgl.load(KC + off + RU).to(ttgl.int32)
    if PL3:  # the plane bits of the unit's 4 tokens (a nibble of the 1-bit plane) into bits 8-11
        u = ((tb % G) // 4)[:, None, None, None] + g[None, None, None, :]  # [NW, 1, 1, g] the unit in its group
        poff = (lan - u + G // 4 + u // 2) + xo  # a channel's unit u is byte u of its run, its plane nibble byte
        # G / 4 + u / 2
        sh = 4 * (u % 2)
        wa = wa | (((ttgl.load(KC + poff).to(ttgl.int32) >> sh) & 15) << 8)
        wb = wb | (((ttgl.load(KC + poff + RU).to(ttgl.int32) >> sh) & 15) << 8)
    # [NW, X, 4] words: pair x's scale word is D / 8 r + x
    soff = (wide(pg, pg * 0 + ks0) * PS + (hk * ks1 + gi * (D // 2)))[:, None, None]
    if FOLD_ROWS:
        soff = (soff + ((D // 8) * r)[None, None, :]) + x[None, :, None]
    else:
        soff = soff + ((D // 4) * r[None, None, :] + 2 * x[None, :, None]) // 2
    soff = soff[:, :, :, None] + g[None, None, None, :] * 0
    return wa, wb, ttgl.load(KS + soff), ttgl.load(KZ + soff)


@gluon.jit
def kc_build(wa, wb, s, m, CODEC: ttgl.constexpr, B: ttgl.constexpr, NW: ttgl.constexpr, TW: ttgl.constexpr,
             D: ttgl.constexpr, tab):
    """K^T fragment [NW, D, TW] fp16 (contraction in k_channel_order, tile positions through tile_tok) from
    `kc_load`'s code units, scale and zero pairs (`tab`: the level table's 8 words, for KT2 / KT3 / KT4)."""
    if CODEC == C_KT4:
        z = wa * 0  # the table words, splat in wa's layout
        tw = [z + tab[0], z + tab[1], z + tab[2], z + tab[3], z + tab[4], z + tab[5], z + tab[6], z + tab[7]]
        o = ttgl.inline_asm_elementwise(AKT40, "=h,=h,=h,=h" + ",r" * 12, [wa, wb, s, m] + tw,
                                        dtype=(ttgl.float16,) * 4, is_pure=True, pack=1)
        p = ttgl.inline_asm_elementwise(AKT41, "=h,=h,=h,=h" + ",r" * 12, [wa, wb, s, m] + tw,
                                        dtype=(ttgl.float16,) * 4, is_pure=True, pack=1)
        j = ttgl.join(ttgl.join(_j2(o[0], o[1]), _j2(o[2], o[3])), ttgl.join(_j2(p[0], p[1]), _j2(p[2], p[3])))
    elif CODEC == C_KT2 or CODEC == C_KT3:
        z = wa * 0
        if CODEC == C_KT2:
            o = ttgl.inline_asm_elementwise(AKT2, "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r,r,r,r",
                                            [wa, wb, s, m, z + tab[0], z + tab[4]], dtype=(ttgl.float16,) * 8,
                                            is_pure=True, pack=1)
        else:
            o = ttgl.inline_asm_elementwise(AKT3, "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r,r,r,r,r,r",
                                            [wa, wb, s, m, z + tab[0], z + tab[1], z + tab[4], z + tab[5]],
                                            dtype=(ttgl.float16,) * 8, is_pure=True, pack=1)
        j = ttgl.join(ttgl.join(_j2(o[0], o[1]), _j2(o[2], o[3])), ttgl.join(_j2(o[4], o[5]), _j2(o[6], o[7])))
    elif CODEC == C_KF4:  # codes only (`C_KF4`): the scale and zero apply to the query and the scores
        o = ttgl.inline_asm_elementwise(AKF40, "=h,=h,=h,=h,r,r", [wa, wb], dtype=(ttgl.float16,) * 4, is_pure=True,
                                        pack=1)
        p = ttgl.inline_asm_elementwise(AKF41, "=h,=h,=h,=h,r,r", [wa, wb], dtype=(ttgl.float16,) * 4, is_pure=True,
                                        pack=1)
        j = ttgl.join(ttgl.join(_j2(o[0], o[1]), _j2(o[2], o[3])), ttgl.join(_j2(p[0], p[1]), _j2(p[2], p[3])))
    elif CODEC == C_KF2:  # codes only (`C_KF2`)
        o = ttgl.inline_asm_elementwise(AKF2, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [wa, wb], dtype=(ttgl.float16,) * 8,
                                        is_pure=True, pack=1)
        j = ttgl.join(ttgl.join(_j2(o[0], o[1]), _j2(o[2], o[3])), ttgl.join(_j2(o[4], o[5]), _j2(o[6], o[7])))
    elif CODEC == C_KC4:
        o = ttgl.inline_asm_elementwise(AKC40, "=h,=h,=h,=h,r,r,r,r", [wa, wb, s, m], dtype=(ttgl.float16,) * 4,
                                        is_pure=True, pack=1)
        p = ttgl.inline_asm_elementwise(AKC41, "=h,=h,=h,=h,r,r,r,r", [wa, wb, s, m], dtype=(ttgl.float16,) * 4,
                                        is_pure=True, pack=1)
        j = ttgl.join(ttgl.join(_j2(o[0], o[1]), _j2(o[2], o[3])), ttgl.join(_j2(p[0], p[1]), _j2(p[2], p[3])))
    else:
        o = ttgl.inline_asm_elementwise(AKC3 if CODEC == C_KC3 else AKC2, "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r,r",
                                        [wa, wb, s, m], dtype=(ttgl.float16,) * 8, is_pure=True, pack=1)
        j = ttgl.join(ttgl.join(_j2(o[0], o[1]), _j2(o[2], o[3])), ttgl.join(_j2(o[4], o[5]), _j2(o[6], o[7])))
    j = ttgl.permute(j, [0, 1, 2, 4, 6, 5, 3])  # [NW, X, r, g, h2, j0, j1] -> [NW, X, r, h2, j1, j0, g]
    return ttgl.convert_layout(ttgl.reshape(j, [NW, D, TW]), B)  # a register permutation within each thread


@gluon.jit
def v_load(VC, VS, VZ, IDX, t0, hi, hk, vc0, vc1, vs0, vs1, CODEC: ttgl.constexpr, WV: ttgl.constexpr,
           G: ttgl.constexpr, P: ttgl.constexpr, TW: ttgl.constexpr, VW: ttgl.constexpr, VWA: ttgl.constexpr,
           NW: ttgl.constexpr, D: ttgl.constexpr, PERM: ttgl.constexpr = False, PS: ttgl.constexpr = 1,
           SD: ttgl.constexpr = 0, MASK: ttgl.constexpr = True):
    """Raw V code words of tokens t0 + w * TW + [0, TW) of warp w, as the words of the first and second token
    of each fragment pair ([NW, WV, g, c] int32), their scales and zeros ([NW, g, c] fp16, or for fp4 values whose
    thread-row spans groups a scale per code word [NW, WV, g, c]: 0 past `hi`,
    so those rows are exactly 0; for F8 the scales are 1 and the codes past `hi` are read as 0). Tile
    positions are tokens through `tile_tok` (PERM: the second token of a pair is TW / 8 rows on, in one page,
    as P % TW == 0 there). Last, int3's plane words of both tokens (else the code words again)."""
    T2: ttgl.constexpr = TW // 8 if PERM else 1  # rows from the first token of a fragment pair to the second
    L3: ttgl.constexpr = ttgl.SliceLayout(3, VW)
    we = ttgl.arange(0, WV, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(2, L3)))
    g = ttgl.arange(0, 8, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(1, L3)))
    word = (WV * g[None, None, :] + we[None, :, None])[:, :, :, None]  # [1, we, g, 1]
    L2W: ttgl.constexpr = ttgl.SliceLayout(1, ttgl.SliceLayout(2, VW))  # [NW, TW]
    I3ANY: ttgl.constexpr = CODEC == C_I3 or CODEC == C_I3A or CODEC == C_CB3
    # int2 and lm2 at D 64: half a word per thread
    HALF: ttgl.constexpr = (CODEC == C_Q2 or CODEC == C_Q2A or CODEC == C_CB2) and D == 64
    if I3ANY:  # thread g: D / 8 channels; word we holds those from c = D / 8 g + 16 we on (D 64: 8 of its 16), at
        # offset og of group gg; its plane bits
        cg = (D // 8) * g[None, None, :] + 16 * we[None, :, None]  # [1, we, g]
        gg = cg // G
        og = cg % G
        word = ((3 * G // 32) * gg + og // 16)[:, :, :, None]
        pword = ((3 * G // 32) * gg + G // 16 + og // 32)[:, :, :, None]
    if HALF:  # thread g: half g % 2 of word g // 2
        word = ((g // 2)[None, None, :] + 0 * we[None, :, None])[:, :, :, None]
    NP: ttgl.constexpr = 2 if CODEC == C_I6 or CODEC == C_I6A else (1 if CODEC == C_I5 or CODEC == C_I5A or
                                                                     CODEC == C_I5G or CODEC == C_I5GA else 0)
    if NP:  # int5 / int6: word we of thread g holds the row's nibble bytes D / 16 g + 4 we .. + 3; its high plane
        word, pword, psh, gi_ = _np_words((D // 16) * g[None, None, :], we[None, :, None], CODEC, G, False)
        word = word[:, :, :, None]
    RWV: ttgl.constexpr = 3 * D // 32 if I3ANY else ((4 + NP) * D // 32 if NP else (D // 16 if HALF else 8 * WV))
    # token bits 0, 3 (, 4) of VW lie in registers; of the scales' pairs (VWA), pair bits 2 (, 3): tokens 8 (, 16)
    rows = tok_rows(IDX, t0, hi, hk, vc0, vc1, RWV, P, TW, TW, 1, L2W, NW, PERM, PS, 1 | ((TW - 1) & ~7), MASK)
    if CODEC == C_F8:  # no scale to zero the rows past `hi` with: their codes (NaN patterns too) are read as 0
        tt = (t0 + ttgl.arange(0, NW, layout=ttgl.SliceLayout(1, L2W)) * TW)[:, None] + \
            tile_tok(ttgl.arange(0, TW, layout=ttgl.SliceLayout(0, L2W)), TW, PERM)[None, :]
        w = mload(VC + rows[:, None, None, :] + word, (tt < hi)[:, None, None, :], 0, MASK)
    else:
        w = ttgl.load(VC + rows[:, None, None, :] + word)  # [NW, we, g, TW]
    if HALF:
        w = w >> (16 * (g % 2))[None, None, :, None]
    if I3ANY and D == 64:  # the thread's 8 channels are bytes 0-1 or 2-3 of the 2-bit word
        w = w >> (16 * ((og // 8) % 2))[:, :, :, None]
    wa, wb = ttgl.split(ttgl.reshape(w, [NW, WV, 8, TW // 2, 2]))  # tokens 2c, 2c + 1: [NW, we, g, c]
    wa = ttgl.convert_layout(wa, VWA, assert_trivial=True)
    wb = ttgl.convert_layout(wb, VWA, assert_trivial=True)
    if I3ANY:  # plane bits of the thread's channels from bit 0 on
        pw = ttgl.load(VC + rows[:, None, None, :] + pword) >> (og % 32)[:, :, :, None]
        pa, pb = ttgl.split(ttgl.reshape(pw, [NW, WV, 8, TW // 2, 2]))
        pa = ttgl.convert_layout(pa, VWA, assert_trivial=True)
        pb = ttgl.convert_layout(pb, VWA, assert_trivial=True)
    elif NP:  # the high plane of each nibble word, shifted to its first channel
        pw = ttgl.load(VC + rows[:, None, None, :] + pword[:, :, :, None]) >> psh[:, :, :, None]
        pa, pb = ttgl.split(ttgl.reshape(pw, [NW, WV, 8, TW // 2, 2]))
        pa = ttgl.convert_layout(pa, VWA, assert_trivial=True)
        pb = ttgl.convert_layout(pb, VWA, assert_trivial=True)
    else:
        pa = wa
        pb = wb
    S3: ttgl.constexpr = ttgl.SliceLayout(1, VWA)  # [NW, g, c]
    NPA: ttgl.constexpr = CODEC == C_I5A or CODEC == C_I6A or CODEC == C_I5GA
    ma = ttgl.full([NW, 8, TW // 2], 0.0, ttgl.float16, layout=S3)
    mb = ma
    if CODEC == C_F8:
        sa = ttgl.full([NW, 8, TW // 2], 1.0, ttgl.float16, layout=S3)
        sb = sa
    else:  # scales of tokens 2c and 2c + 1 (one page: P is even) for the block of the thread's bytes (g // 2)
        sg = ttgl.arange(0, 8, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(2, S3)))
        L2: ttgl.constexpr = ttgl.SliceLayout(1, S3)  # [NW, c]
        srow = tok_rows(IDX, t0, hi, hk, vs0, vs1, D // G, P, TW, TW // 2, 2, L2, NW, PERM, PS,
                        (TW - 1) & ~7, MASK)  # first token of a pair
        tw = ttgl.arange(0, NW, layout=ttgl.SliceLayout(1, L2))
        tc = ttgl.arange(0, TW // 2, layout=ttgl.SliceLayout(0, L2))
        ta = (t0 + tw * TW)[:, None] + tile_tok(2 * tc, TW, PERM)[None, :]  # [NW, c] first token of the pair
        if D // 8 > G:  # the thread's D / 8 channels span groups (fp4 groups of 16 at D 256): a scale per code word,
            # [NW, we, g, c]; the thread's 4 WV bytes hold its D / 8 channels, a group G * 32 WV / D of them
            GBV: ttgl.constexpr = G * 32 * WV // D
            wa_ = ttgl.arange(0, WV, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(2, ttgl.SliceLayout(3, VWA))))
            ga_ = ttgl.arange(0, 8, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(1, ttgl.SliceLayout(3, VWA))))
            sgw = ((4 * WV * ga_[None, None, :] + 4 * wa_[None, :, None]) // GBV)[:, :, :, None]  # [1, we, g, 1]
            off = srow[:, None, :][:, None, :, :] + sgw
            ma4 = (ta < hi)[:, None, :][:, None, :, :]
            mb4 = (ta + T2 < hi)[:, None, :][:, None, :, :]
            sa = scale16(mload(VS + off, ma4, 0, MASK), SD)
            sb = scale16(mload(VS + off + T2 * (D // G), mb4, 0, MASK), SD)
        else:
            off = srow[:, None, :] + (sg * (D // 8) // G)[None, :, None]  # the group of the thread's D / 8 channels
            sa = scale16(mload(VS + off, (ta < hi)[:, None, :], 0, MASK), SD)
            sb = scale16(mload(VS + off + T2 * (D // G), (ta + T2 < hi)[:, None, :], 0, MASK), SD)
        if CODEC == C_Q4A or CODEC == C_I8A or CODEC == C_Q2A or CODEC == C_I3A or NPA:
            ma = mload(VZ + off, (ta < hi)[:, None, :], 0.0, MASK)
            mb = mload(VZ + off + T2 * (D // G), (ta + T2 < hi)[:, None, :], 0.0, MASK)
    return wa, wb, sa, sb, ma, mb, pa, pb


# ---- fragment builders ---------------------------------------------------------------------------------
@gluon.jit
def _j2(a, b):
    return ttgl.join(a, b)


@gluon.jit
def _i3(wa, wb, pa, pb, sa, sb, ma, mb, ASYMC: ttgl.constexpr, CODEC: ttgl.constexpr, tab, AS: ttgl.constexpr,
        AA: ttgl.constexpr, AL: ttgl.constexpr):
    """int3 / lm3 fields of byte k (the asm AS / AA / AL) -> [..., t, f0, f1]: (A, B) joined innermost, then the
    field."""
    if CODEC == C_CB3:
        z = wa * 0  # the table's low-byte and high-byte word pairs, splat in wa's layout
        o = ttgl.inline_asm_elementwise(AL, "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r,r,h,h,r,r,r,r",
                                        [wa, wb, pa, pb, sa, sb, z + tab[0], z + tab[1], z + tab[4], z + tab[5]],
                                        dtype=(ttgl.float16,) * 8, is_pure=True, pack=1)
    elif ASYMC:
        o = ttgl.inline_asm_elementwise(AA, "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r,r,h,h,h,h,h,h",
                                        [wa, wb, pa, pb, sa, sb, sa * 0.25, sb * 0.25, ma, mb],
                                        dtype=(ttgl.float16,) * 8, is_pure=True, pack=1)
    else:
        o = ttgl.inline_asm_elementwise(AS, "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r,r,h,h,h,h",
                                        [wa, wb, pa, pb, sa, sb, sa * 0.25, sb * 0.25],
                                        dtype=(ttgl.float16,) * 8, is_pure=True, pack=1)
    return ttgl.join(ttgl.join(_j2(o[0], o[1]), _j2(o[2], o[3])), ttgl.join(_j2(o[4], o[5]), _j2(o[6], o[7])))


@gluon.jit
def _np1(wa, wb, pa, pb, sa, sb, ma, mb, ASYMC: ttgl.constexpr, AS: ttgl.constexpr, AA: ttgl.constexpr):
    """int5 / int6, byte k of words A and B (the asm AS, or AA with zeros) -> [..., h2, f]: (A, B) innermost, then the
    low / high nibble."""
    if ASYMC:
        o = ttgl.inline_asm_elementwise(AA, "=h,=h,=h,=h,r,r,r,r,h,h,h,h,h,h",
                                        [wa, wb, pa, pb, sa, sb, sa * 0.0625, sb * 0.0625, ma, mb],
                                        dtype=(ttgl.float16,) * 4, is_pure=True, pack=1)
    else:
        o = ttgl.inline_asm_elementwise(AS, "=h,=h,=h,=h,r,r,r,r,h,h,h,h",
                                        [wa, wb, pa, pb, sa, sb, sa * 0.0625, sb * 0.0625],
                                        dtype=(ttgl.float16,) * 4, is_pure=True, pack=1)
    return ttgl.join(_j2(o[0], o[1]), _j2(o[2], o[3]))


@gluon.jit
def _np4(wa, wb, pa, pb, sa, sb, ma, mb, CODEC: ttgl.constexpr):
    """int5 / int6 words A and B (and their high planes) -> [..., h2, f, k0, k1]: bytes k = k0 + 2 k1."""
    if CODEC == C_I5 or CODEC == C_I5A:
        A: ttgl.constexpr = CODEC == C_I5A
        j = ttgl.join(ttgl.join(_np1(wa, wb, pa, pb, sa, sb, ma, mb, A, AN50, AM50),
                                _np1(wa, wb, pa, pb, sa, sb, ma, mb, A, AN51, AM51)),
                      ttgl.join(_np1(wa, wb, pa, pb, sa, sb, ma, mb, A, AN52, AM52),
                                _np1(wa, wb, pa, pb, sa, sb, ma, mb, A, AN53, AM53)))
    elif CODEC == C_I6 or CODEC == C_I6A:
        A: ttgl.constexpr = CODEC == C_I6A
        j = ttgl.join(ttgl.join(_np1(wa, wb, pa, pb, sa, sb, ma, mb, A, AN60, AM60),
                                _np1(wa, wb, pa, pb, sa, sb, ma, mb, A, AN61, AM61)),
                      ttgl.join(_np1(wa, wb, pa, pb, sa, sb, ma, mb, A, AN62, AM62),
                                _np1(wa, wb, pa, pb, sa, sb, ma, mb, A, AN63, AM63)))
    else:
        A: ttgl.constexpr = CODEC == C_I5GA
        j = ttgl.join(ttgl.join(_np1(wa, wb, pa, pb, sa, sb, ma, mb, A, AG50, AH50),
                                _np1(wa, wb, pa, pb, sa, sb, ma, mb, A, AG51, AH51)),
                      ttgl.join(_np1(wa, wb, pa, pb, sa, sb, ma, mb, A, AG52, AH52),
                                _np1(wa, wb, pa, pb, sa, sb, ma, mb, A, AG53, AH53)))
    return j


@gluon.jit
def k_build(w, w2, s, m, CODEC: ttgl.constexpr, B: ttgl.constexpr, NW: ttgl.constexpr, TW: ttgl.constexpr,
            D: ttgl.constexpr, G: ttgl.constexpr, tab):
    """K^T fragment [NW, D, TW] fp16, contraction in k_channel_order(CODEC), from `k_load`'s words, scales
    and zeros (`tab`: the codebook's 8 table words, for CB)."""
    PW: ttgl.constexpr = CODEC != C_F8 and D // 4 > G  # k_load gave a scale (and zero) per code word
    I3ANY: ttgl.constexpr = CODEC == C_I3 or CODEC == C_I3A or CODEC == C_CB3
    NP: ttgl.constexpr = CODEC == C_I5 or CODEC == C_I5A or CODEC == C_I6 or CODEC == C_I6A or CODEC == C_I5G or \
        CODEC == C_I5GA
    WK: ttgl.constexpr = w.shape[1]
    if not PW and not I3ANY and not NP and CODEC != C_Q4G:
        s = ttgl.broadcast(ttgl.expand_dims(s, 1), w)[0]
    if CODEC == C_Q4G:  # the codes as they enter the MMA (`C_Q4G`); scales and offsets apply to the scores
        o = ttgl.inline_asm_elementwise(ASM_K_Q4G, "=h,=h,=h,=h,=h,=h,=h,=h,r", [w], dtype=(ttgl.float16,) * 8,
                                        is_pure=True, pack=1)
        j = ttgl.join(ttgl.join(_j2(o[0], o[1]), _j2(o[2], o[3])),
                      ttgl.join(_j2(o[4], o[5]), _j2(o[6], o[7])))  # [NW, wi, r, TW, h2, q0, q1]
        j = ttgl.permute(j, [0, 1, 6, 5, 2, 4, 3])  # [NW, wi, q1, q0, r, h2, TW]
    elif CODEC == C_Q4 or CODEC == C_Q4A or CODEC == C_F4M or CODEC == C_F4N or CODEC == C_CB:
        if CODEC == C_F4M or CODEC == C_F4N:
            o = ttgl.inline_asm_elementwise(ASM_K_F4, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [w, s],
                                            dtype=(ttgl.float16,) * 8, is_pure=True, pack=1)
        elif CODEC == C_CB:
            z = w * 0  # the table words, splat in w's layout
            o = ttgl.inline_asm_elementwise(ASM_K_CB, "=h,=h,=h,=h,=h,=h,=h,=h,r,h,r,r,r,r,r,r,r,r",
                                            [w, s, z + tab[0], z + tab[1], z + tab[2], z + tab[3], z + tab[4],
                                             z + tab[5], z + tab[6], z + tab[7]],
                                            dtype=(ttgl.float16,) * 8, is_pure=True, pack=1)
        elif CODEC == C_Q4:
            o = ttgl.inline_asm_elementwise(ASM_K_Q4, "=h,=h,=h,=h,=h,=h,=h,=h,r,h,h", [w, s, s * 0.0625],
                                            dtype=(ttgl.float16,) * 8, is_pure=True, pack=1)
        else:
            if not PW:
                m = ttgl.broadcast(ttgl.expand_dims(m, 1), w)[0]
            o = ttgl.inline_asm_elementwise(ASM_K_Q4A, "=h,=h,=h,=h,=h,=h,=h,=h,r,h,h,h", [w, s, s * 0.0625, m],
                                            dtype=(ttgl.float16,) * 8, is_pure=True, pack=1)
        j = ttgl.join(ttgl.join(_j2(o[0], o[1]), _j2(o[2], o[3])),
                      ttgl.join(_j2(o[4], o[5]), _j2(o[6], o[7])))  # [NW, wi, r, TW, h2, q0, q1]
        j = ttgl.permute(j, [0, 1, 6, 5, 2, 4, 3])  # [NW, wi, q1, q0, r, h2, TW]
    elif I3ANY and D == 64:  # one 2-bit word per thread-row (channels 0-7 in bytes 0-1, 8-15 in bytes 2-3), its plane
        A: ttgl.constexpr = CODEC == C_I3A
        s = ttgl.broadcast(ttgl.expand_dims(s, 1), w)[0]
        m = ttgl.broadcast(ttgl.expand_dims(m, 1), w)[0]
        wb = w >> 16
        pb = w2 >> 8
        j = ttgl.join(_i3(w, wb, w2, pb, s, s, m, m, A, CODEC, tab, AI30, AJ30, AL30),
                      _i3(w, wb, w2, pb, s, s, m, m, A, CODEC, tab, AI31, AJ31, AL31))  # [NW, wi, r, TW, h2, f0, f1, k0]
        j = ttgl.permute(j, [0, 1, 7, 6, 5, 2, 4, 3])  # [NW, wi, k0, f1, f0, r, h2, TW]
    elif I3ANY and D == 256:  # two 32-channel runs u per thread-row: words 2 u, 2 u + 1 and their plane words
        A: ttgl.constexpr = CODEC == C_I3A
        if not PW:
            s = ttgl.broadcast(ttgl.expand_dims(s, 1), w)[0]
            m = ttgl.broadcast(ttgl.expand_dims(m, 1), w)[0]
        wa, wb = ttgl.split(ttgl.reshape(ttgl.permute(w, [0, 2, 3, 1]), [NW, 4, TW, 2, 2]))  # [NW, r, TW, u]
        pa, pb = ttgl.split(ttgl.reshape(ttgl.permute(w2, [0, 2, 3, 1]), [NW, 4, TW, 2, 2]))
        s, s_ = ttgl.split(ttgl.reshape(ttgl.permute(s, [0, 2, 3, 1]), [NW, 4, TW, 2, 2]))  # a run is in one group
        m, m_ = ttgl.split(ttgl.reshape(ttgl.permute(m, [0, 2, 3, 1]), [NW, 4, TW, 2, 2]))
        j = ttgl.join(ttgl.join(_i3(wa, wb, pa, pb, s, s, m, m, A, CODEC, tab, AI30, AJ30, AL30),
                                _i3(wa, wb, pa, pb, s, s, m, m, A, CODEC, tab, AI31, AJ31, AL31)),
                      ttgl.join(_i3(wa, wb, pa, pb, s, s, m, m, A, CODEC, tab, AI32, AJ32, AL32),
                                _i3(wa, wb, pa, pb, s, s, m, m, A, CODEC, tab, AI33, AJ33, AL33)))
        # [NW, r, TW, u, h2, f0, f1, k0, k1] -> [NW, u, k1, k0, f1, f0, r, h2, TW]
        j = ttgl.permute(j, [0, 3, 8, 7, 6, 5, 1, 4, 2])
    elif I3ANY:  # the thread-row's words 0 / 1 = channels 0-15 / 16-31, w2 their plane words (shifted for word 1)
        wa, wb = ttgl.split(ttgl.permute(w, [0, 2, 3, 1]))  # [NW, r, TW]
        pa, pb = ttgl.split(ttgl.permute(w2, [0, 2, 3, 1]))
        A: ttgl.constexpr = CODEC == C_I3A  # s, m: [NW, r, TW], one group per thread-row, put in wa's layout
        s, s_ = ttgl.split(ttgl.permute(ttgl.broadcast(ttgl.expand_dims(s, 1), w)[0], [0, 2, 3, 1]))
        m, m_ = ttgl.split(ttgl.permute(ttgl.broadcast(ttgl.expand_dims(m, 1), w)[0], [0, 2, 3, 1]))
        j = ttgl.join(ttgl.join(_i3(wa, wb, pa, pb, s, s, m, m, A, CODEC, tab, AI30, AJ30, AL30),
                                _i3(wa, wb, pa, pb, s, s, m, m, A, CODEC, tab, AI31, AJ31, AL31)),
                      ttgl.join(_i3(wa, wb, pa, pb, s, s, m, m, A, CODEC, tab, AI32, AJ32, AL32),
                                _i3(wa, wb, pa, pb, s, s, m, m, A, CODEC, tab, AI33, AJ33, AL33)))
        # [NW, r, TW, h2, f0, f1, k0, k1]
        j = ttgl.permute(j, [0, 7, 6, 5, 4, 1, 3, 2])  # [NW, k1, k0, f1, f0, r, h2, TW]
    elif NP:  # int5 / int6: words 2 u and 2 u + 1 of the thread-row as A and B (h2), their high planes in w2
        if not PW:
            s = ttgl.broadcast(ttgl.expand_dims(s, 1), w)[0]
            m = ttgl.broadcast(ttgl.expand_dims(m, 1), w)[0]
        if D == 64:  # the thread-row's two words: [NW, wi, r, TW] -> [NW, r, TW]
            wa, wb = ttgl.split(ttgl.permute(w, [0, 2, 3, 1]))
            pa, pb = ttgl.split(ttgl.permute(w2, [0, 2, 3, 1]))
            sa, sb = ttgl.split(ttgl.permute(s, [0, 2, 3, 1]))
            ma, mb = ttgl.split(ttgl.permute(m, [0, 2, 3, 1]))
            j = _np4(wa, wb, pa, pb, sa, sb, ma, mb, CODEC)  # [NW, r, TW, h2, f, k0, k1]
            j = ttgl.permute(j, [0, 6, 5, 4, 1, 3, 2])  # [NW, k1, k0, f, r, h2, TW]
        else:  # [NW, wi, r, TW] -> [NW, r, TW, u, h2] (wi = 2 u + h2)
            U: ttgl.constexpr = WK // 2
            wa, wb = ttgl.split(ttgl.reshape(ttgl.permute(w, [0, 2, 3, 1]), [NW, 4, TW, U, 2]))
            pa, pb = ttgl.split(ttgl.reshape(ttgl.permute(w2, [0, 2, 3, 1]), [NW, 4, TW, U, 2]))
            sa, sb = ttgl.split(ttgl.reshape(ttgl.permute(s, [0, 2, 3, 1]), [NW, 4, TW, U, 2]))
            ma, mb = ttgl.split(ttgl.reshape(ttgl.permute(m, [0, 2, 3, 1]), [NW, 4, TW, U, 2]))
            j = _np4(wa, wb, pa, pb, sa, sb, ma, mb, CODEC)  # [NW, r, TW, u, h2, f, k0, k1]
            j = ttgl.permute(j, [0, 3, 7, 6, 5, 1, 4, 2])  # [NW, u, k1, k0, f, r, h2, TW]
    elif CODEC == C_Q2 or CODEC == C_Q2A or CODEC == C_CB2:
        if CODEC == C_CB2:
            z = w * 0  # the table's low-byte and high-byte words, splat in w's layout
            o = ttgl.inline_asm_elementwise(ASM_K_CB2, "=h," * 16 + "r,h,r,r", [w, s, z + tab[0], z + tab[4]],
                                            dtype=(ttgl.float16,) * 16, is_pure=True, pack=1)
        elif CODEC == C_Q2:
            o = ttgl.inline_asm_elementwise(ASM_K_Q2, "=h," * 16 + "r,h,h", [w, s, s * 0.25],
                                            dtype=(ttgl.float16,) * 16, is_pure=True, pack=1)
        else:
            if not PW:
                m = ttgl.broadcast(ttgl.expand_dims(m, 1), w)[0]
            o = ttgl.inline_asm_elementwise(ASM_K_Q2A, "=h," * 16 + "r,h,h,h", [w, s, s * 0.25, m],
                                            dtype=(ttgl.float16,) * 16, is_pure=True, pack=1)
        j = ttgl.join(ttgl.join(ttgl.join(_j2(o[0], o[1]), _j2(o[2], o[3])),
                                ttgl.join(_j2(o[4], o[5]), _j2(o[6], o[7]))),
                      ttgl.join(ttgl.join(_j2(o[8], o[9]), _j2(o[10], o[11])),
                                ttgl.join(_j2(o[12], o[13]), _j2(o[14], o[15]))))  # [NW, wi, r, TW, h2, q0, q1, q2]
        j = ttgl.permute(j, [0, 1, 7, 6, 5, 2, 4, 3])  # [NW, wi, q2, q1, q0, r, h2, TW]
    else:
        if CODEC == C_I8:
            o = ttgl.inline_asm_elementwise(ASM_K_I8, "=h,=h,=h,=h,r,h", [w, s], dtype=(ttgl.float16,) * 4,
                                            is_pure=True, pack=1)
        elif CODEC == C_I8A:
            if not PW:
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
def _v_q2(wa, wb, sa, sb, sa4, sb4, ASM: ttgl.constexpr):
    o = ttgl.inline_asm_elementwise(ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r,r,h,h,h,h", [wa, wb, sa, sb, sa4, sb4],
                                    dtype=(ttgl.float16,) * 8, is_pure=True, pack=1)
    return ttgl.join(ttgl.join(_j2(o[0], o[1]), _j2(o[2], o[3])), ttgl.join(_j2(o[4], o[5]), _j2(o[6], o[7])))


@gluon.jit
def _v_q2a(wa, wb, sa, sb, sa4, sb4, ma, mb, ASM: ttgl.constexpr):
    o = ttgl.inline_asm_elementwise(ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r,r,h,h,h,h,h,h", [wa, wb, sa, sb, sa4, sb4, ma, mb],
                                    dtype=(ttgl.float16,) * 8, is_pure=True, pack=1)
    return ttgl.join(ttgl.join(_j2(o[0], o[1]), _j2(o[2], o[3])), ttgl.join(_j2(o[4], o[5]), _j2(o[6], o[7])))


@gluon.jit
def _v_cb2(wa, wb, sa, sb, tab, ASM: ttgl.constexpr):
    z = wa * 0
    o = ttgl.inline_asm_elementwise(ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r,r,h,h,r,r",
                                    [wa, wb, sa, sb, z + tab[0], z + tab[4]], dtype=(ttgl.float16,) * 8, is_pure=True,
                                    pack=1)
    return ttgl.join(ttgl.join(_j2(o[0], o[1]), _j2(o[2], o[3])), ttgl.join(_j2(o[4], o[5]), _j2(o[6], o[7])))


@gluon.jit
def _v_f4(wa, wb, sa, sb, ASM: ttgl.constexpr):
    o = ttgl.inline_asm_elementwise(ASM, "=h,=h,=h,=h,r,r,h,h", [wa, wb, sa, sb], dtype=(ttgl.float16,) * 4,
                                    is_pure=True, pack=1)
    return ttgl.join(_j2(o[0], o[1]), _j2(o[2], o[3]))  # [..., t0, h]


@gluon.jit
def _v_cb(wa, wb, sa, sb, tab, ASM: ttgl.constexpr):
    z = wa * 0
    o = ttgl.inline_asm_elementwise(ASM, "=h,=h,=h,=h,r,r,h,h,r,r,r,r,r,r,r,r",
                                    [wa, wb, sa, sb, z + tab[0], z + tab[1], z + tab[2], z + tab[3], z + tab[4],
                                     z + tab[5], z + tab[6], z + tab[7]],
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
def v_build(wa, wb, sa, sb, ma, mb, pa, pb, CODEC: ttgl.constexpr, B: ttgl.constexpr, NW: ttgl.constexpr,
            TW: ttgl.constexpr, D: ttgl.constexpr, tab):
    """V fragment [NW, TW, D] fp16, columns in v_channel_order(CODEC), from `v_load`'s words, scales, zeros (a
    scale per thread-row [NW, g, c], or per code word [NW, we, g, c] where the thread-row spans groups: fp4 only)."""
    if len(sa.shape) == 3:
        sa = ttgl.broadcast(ttgl.expand_dims(sa, 1), wa)[0]
        sb = ttgl.broadcast(ttgl.expand_dims(sb, 1), wa)[0]
    if CODEC == C_F4M or CODEC == C_F4N or CODEC == C_CB:
        if CODEC == C_CB:
            j = ttgl.join(ttgl.join(_v_cb(wa, wb, sa, sb, tab, AVC0), _v_cb(wa, wb, sa, sb, tab, AVC1)),
                          ttgl.join(_v_cb(wa, wb, sa, sb, tab, AVC2), _v_cb(wa, wb, sa, sb, tab, AVC3)))
        else:
            j = ttgl.join(ttgl.join(_v_f4(wa, wb, sa, sb, AVE0), _v_f4(wa, wb, sa, sb, AVE1)),
                          ttgl.join(_v_f4(wa, wb, sa, sb, AVE2), _v_f4(wa, wb, sa, sb, AVE3)))
        j = ttgl.permute(j, [0, 3, 4, 1, 7, 6, 5, 2])  # as int4: [NW, c, t0, we, k1, k0, h, g]
    elif CODEC == C_Q4 or CODEC == C_Q4A:
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
    elif CODEC == C_I5 or CODEC == C_I5A or CODEC == C_I6 or CODEC == C_I6A or CODEC == C_I5G or CODEC == C_I5GA:
        j = _np4(wa, wb, pa, pb, sa, sb, ttgl.broadcast(ttgl.expand_dims(ma, 1), wa)[0],
                 ttgl.broadcast(ttgl.expand_dims(mb, 1), wa)[0], CODEC)  # [NW, we, g, c, t0, h, k0, k1]
        j = ttgl.permute(j, [0, 3, 4, 1, 7, 6, 5, 2])  # as int4: [NW, c, t0, we, k1, k0, h, g]
    elif CODEC == C_I3 or CODEC == C_I3A or CODEC == C_CB3:
        if CODEC == C_I3A:
            ma = ttgl.broadcast(ttgl.expand_dims(ma, 1), wa)[0]
            mb = ttgl.broadcast(ttgl.expand_dims(mb, 1), wa)[0]
        A: ttgl.constexpr = CODEC == C_I3A
        if D == 64:  # bytes 0 and 1: [NW, we, g, c, t0, f0, f1, k0] -> [NW, c, t0, we, k0, f1, f0, g]
            j = ttgl.join(_i3(wa, wb, pa, pb, sa, sb, ma, mb, A, CODEC, tab, AI30, AJ30, AL30),
                          _i3(wa, wb, pa, pb, sa, sb, ma, mb, A, CODEC, tab, AI31, AJ31, AL31))
            j = ttgl.permute(j, [0, 3, 4, 1, 7, 6, 5, 2])
        else:
            j = ttgl.join(ttgl.join(_i3(wa, wb, pa, pb, sa, sb, ma, mb, A, CODEC, tab, AI30, AJ30, AL30),
                                    _i3(wa, wb, pa, pb, sa, sb, ma, mb, A, CODEC, tab, AI31, AJ31, AL31)),
                          ttgl.join(_i3(wa, wb, pa, pb, sa, sb, ma, mb, A, CODEC, tab, AI32, AJ32, AL32),
                                    _i3(wa, wb, pa, pb, sa, sb, ma, mb, A, CODEC, tab, AI33, AJ33, AL33)))
            j = ttgl.permute(j, [0, 3, 4, 1, 8, 7, 6, 5, 2])  # as int2: [NW, c, t0, we, k1, k0, f1, f0, g]
    elif CODEC == C_Q2 or CODEC == C_Q2A or CODEC == C_CB2:
        sa4 = sa * 0.25
        sb4 = sb * 0.25
        if CODEC == C_Q2A:
            ma = ttgl.broadcast(ttgl.expand_dims(ma, 1), wa)[0]
            mb = ttgl.broadcast(ttgl.expand_dims(mb, 1), wa)[0]
        if D == 64:  # half a word: bytes 0 and 1 -> [NW, we, g, c, t0, f0, f1, k0] -> [NW, c, t0, we, k0, f1, f0, g]
            if CODEC == C_CB2:
                j = ttgl.join(_v_cb2(wa, wb, sa, sb, tab, AVL0), _v_cb2(wa, wb, sa, sb, tab, AVL1))
            elif CODEC == C_Q2:
                j = ttgl.join(_v_q2(wa, wb, sa, sb, sa4, sb4, AVT0), _v_q2(wa, wb, sa, sb, sa4, sb4, AVT1))
            else:
                j = ttgl.join(_v_q2a(wa, wb, sa, sb, sa4, sb4, ma, mb, AVU0),
                              _v_q2a(wa, wb, sa, sb, sa4, sb4, ma, mb, AVU1))
            j = ttgl.permute(j, [0, 3, 4, 1, 7, 6, 5, 2])
        else:
            if CODEC == C_CB2:
                j = ttgl.join(ttgl.join(_v_cb2(wa, wb, sa, sb, tab, AVL0), _v_cb2(wa, wb, sa, sb, tab, AVL1)),
                              ttgl.join(_v_cb2(wa, wb, sa, sb, tab, AVL2), _v_cb2(wa, wb, sa, sb, tab, AVL3)))
            elif CODEC == C_Q2:
                j = ttgl.join(ttgl.join(_v_q2(wa, wb, sa, sb, sa4, sb4, AVT0), _v_q2(wa, wb, sa, sb, sa4, sb4, AVT1)),
                              ttgl.join(_v_q2(wa, wb, sa, sb, sa4, sb4, AVT2), _v_q2(wa, wb, sa, sb, sa4, sb4, AVT3)))
            else:
                j = ttgl.join(ttgl.join(_v_q2a(wa, wb, sa, sb, sa4, sb4, ma, mb, AVU0),
                                        _v_q2a(wa, wb, sa, sb, sa4, sb4, ma, mb, AVU1)),
                              ttgl.join(_v_q2a(wa, wb, sa, sb, sa4, sb4, ma, mb, AVU2),
                                        _v_q2a(wa, wb, sa, sb, sa4, sb4, ma, mb, AVU3)))
            # [NW, we, g, c, t0, f0, f1, k0, k1] -> [NW, c, t0, we, k1, k0, f1, f0, g]
            j = ttgl.permute(j, [0, 3, 4, 1, 8, 7, 6, 5, 2])
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
