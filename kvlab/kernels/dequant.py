"""Shared Triton dequantization of one K/V tile, for the decode and extend kernels.

A spec reaches the kernels as one constexpr tuple `CFG` (built by `tile_config`), so every
spec family runs through the same code: only the constexpr branches differ.

Codes are read as whole rows of load units (int32 words when the layout allows, else int16 /
uint8): a tile's units are one contiguous [BLOCK_N, row_units] load per bit plane, unpacked with
one shift and one mask per element. Columns come out in "unit order" (unit u, sub-element k),
which for GGML-strided nibbles is a permutation of head_dim: the caller permutes q's dims for K
and scatters the output's dims for V with `perm` (no shuffles in registers). Int codes become
floats with the fp32 magic number (OR into 2^23's mantissa, subtract 2^23) instead of a slow
int->float convert; zero point and scale then fold into one FMA.

This module imports Triton; `kvlab.kernels` does not import it at import time.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..quant.packing import plane_order
from .dequant_half import byte_tile, half_scales, nibble_rows, nibble_tile

KINDS = {"bf16": 0, "fp16": 0, "int": 1, "fp8_e4m3": 2, "fp8_e5m2": 3, "fp4_e2m1": 4, "nf4": 5, "iq4nl": 5}
SCALE_KINDS = {"f16": 1, "bf16": 1, "f32": 1, "e8m0": 2, "e4m3": 3}


def _tile_order(w: int, G: int, word: int, r: int, strided: bool, asm: bool = False) -> int:
    """Element (within its group) of unit-order column r of a plane of width w."""
    K = word * 8 // w
    u, k = divmod(r, K)
    if asm and w == 4:  # asm path emits (unit, j, m) with nibble k = j + 4 m
        j, m = divmod(k, 2)
        k = j + 4 * m
    byte, m = u * word + k // (8 // w), k % (8 // w)
    return byte + m * (G * w // 8) if strided else byte * (8 // w) + m


def tile_config(spec, D: int, word_max: int = 4, asm: bool = False, rowfirst: bool = False) -> tuple[tuple, list[int]]:
    """(CFG constexpr tuple, perm) for `spec` with head_dim D.

    perm[col] = head_dim element held by column col of a dequantized tile (identity except for
    GGML-strided planes). CFG fields (indices are used in the kernels):
    0 KIND, 1 G, 2 NG, 3 WORD, 4 NP, 5..9 plane0 (W, SHIFT, OFF units, STRIDED, GATHER), 10..14 plane1,
    15..19 plane2, 20 GBU (group bytes in units), 21 FULL (one plane spans the row), 22 XOR8,
    23 OFFSET (code offset of symmetric ints), 24 SK (scale kind), 25 HAS_ZERO, 26 CHAN, 27 ASM,
    28 BYTES (one 8-bit plane read as a [BN, NG, G] byte tile; WORD = 1), 29 ROWS (rowfirst nibble unpack:
    8 codes per asm instance from one word, `dequant_half.nibble_rows`).
    """
    if spec.is_float_storage:
        return (0, D, 1, 1, 0) + (0,) * 15 + (0, 1, 0, 0, 0, 0, 0, 0, 0, 0), list(range(D))
    G = spec.group_size(D)
    NG = 1 if spec.axis == "chan" else D // G
    GB = G * spec.bits // 8
    planes, off = [], 0
    for shift, w in plane_order(spec):
        strided = spec.pack == "ggml" and w not in (1, 8)
        planes.append([w, shift, off, strided])
        off += G * w // 8
    word = word_max
    # one 8-bit plane per token row (q8_0, int8, fp8): read as bytes, one [BN, NG, G] load, no unpacking
    byte_rows = len(planes) == 1 and planes[0][0] == 8 and spec.axis != "chan" and spec.fmt in (
        "int", "fp8_e4m3", "fp8_e5m2")
    if byte_rows:
        word = 1
    while word > 1 and any(x % word for x in [GB] + [p[2] for p in planes] + [G * p[0] // 8 for p in planes]):
        word //= 2
    # fp8 stays on the plain byte-row path: on the H200 (run2) it ran 0.93 ms vs 1.36 ms for the fp16 tile
    # (the fp16 tile is built in the MMA operand layout: V's bytes are read from smem one at a time)
    # rowfirst (config "layout"): the fp16 tile is built in the row layout and anchored there, so fp8's
    # cvt.rn.f16x2.e4m3x2 fast path no longer reads bytes one at a time from smem: allowed again
    asm = bool(asm and spec.axis != "chan" and ((spec.fmt == "int" and ((spec.bits == 4 and word == 4) or byte_rows))
                                                or (rowfirst and byte_rows and spec.fmt.startswith("fp8"))))
    rows4 = asm and rowfirst and not byte_rows  # nibbles, rowfirst: a byte tile, (byte, nibble) column order
    if rows4:
        word = 1
    main = max(planes, key=lambda p: p[0])
    order = [_tile_order(main[0], G, word, r, main[3], asm) for r in range(G)]
    if rows4:  # (byte, nibble) column order of nibble_rows = the plain path's with WORD 1
        order = [_tile_order(main[0], G, 1, r, main[3]) for r in range(G)]
    perm = [g * G + order[r] for g in range(NG) for r in range(G)] if spec.axis != "chan" else list(range(D))
    fields = []
    for p in planes:
        gather = [_tile_order(p[0], G, word, r, p[3]) for r in range(G)] != order
        fields += [p[0], p[1], p[2] // word, int(p[3]), int(gather)]
    fields += [0] * (15 - len(fields))
    sym_int = spec.fmt == "int" and spec.sym
    offset = 2 ** (spec.bits - 1) if sym_int else 0
    xor8 = int(sym_int and spec.bits == 8)
    sk = SCALE_KINDS[spec.scale_dtype] if spec.has_scale and spec.axis != "tensor" else 0
    cfg = (KINDS[spec.fmt], G, NG, word, len(planes), *fields, GB // word, int(len(planes) == 1), xor8, offset, sk,
           int(not spec.sym), int(spec.axis == "chan"), int(asm), int(byte_rows), int(rows4))
    return cfg, perm


# ---- element and scale values -------------------------------------------------------------------
@triton.jit
def code_values(c, LUT, KIND: tl.constexpr):
    """int32 codes -> float32 element values (before scales)."""
    if KIND == 1:  # exact int -> float: 2^23 + c as bits, minus 2^23 (LOP3 + FADD, no I2F)
        x = (c | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
    elif KIND == 2:
        x = c.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
    elif KIND == 3:
        x = c.to(tl.uint8).to(tl.float8e5, bitcast=True).to(tl.float32)
    elif KIND == 4:  # e2m1 -> fp16 bits (sign at 15, exp+mantissa at 9..11), times 2^14 (exact, subnormals too)
        h = (((c & 8) << 12) | ((c & 7) << 9)).to(tl.int16).to(tl.float16, bitcast=True)
        x = h.to(tl.float32) * 16384.0
    else:  # 16-entry codebook (nf4, iq4nl): an L1-resident table
        x = tl.load(LUT + c)
    return x


@triton.jit
def scale_values(s, SK: tl.constexpr):
    """Stored scales -> float32 (SK: 1 float, 2 e8m0 biased exponent, 3 e4m3 bytes)."""
    if SK == 3:
        v = s.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    elif SK == 2:
        e = s.to(tl.int32)
        v = (e << 23).to(tl.float32, bitcast=True)
        v = tl.where(e == 255, float("nan"), v)
    else:
        v = s.to(tl.float32)
    return v


# ---- bit planes ------------------------------------------------------------------------------
@triton.jit
def plane_tile(CP, row, rmask, W: tl.constexpr, OFFU: tl.constexpr, CFG: tl.constexpr, BN: tl.constexpr,
               D: tl.constexpr):
    """One bit plane of BN token rows (row: [BN] unit offsets) -> int32 [BN, D] in unit order."""
    G: tl.constexpr = CFG[1]
    NG: tl.constexpr = CFG[2]
    WORD: tl.constexpr = CFG[3]
    NU: tl.constexpr = G * W // 8 // WORD
    K: tl.constexpr = WORD * 8 // W
    cols = tl.arange(0, NG * NU)
    if CFG[21]:
        offs = cols  # the plane is the whole row: one contiguous (vectorizable) load
    else:
        offs = (cols // NU) * CFG[20] + OFFU + cols % NU
    u = tl.load(CP + row[:, None] + offs[None, :], mask=rmask[:, None], other=0).to(tl.int32)  # [BN, NG*NU]
    if CFG[22]:  # int8 two's complement -> offset binary, once per unit
        u = u ^ (-2139062144 if WORD == 4 else (0x8080 if WORD == 2 else 0x80))
    sh = tl.arange(0, K) * W
    c = (u[:, :, None] >> sh[None, None, :]) & ((1 << W) - 1)  # [BN, NG*NU, K]
    return tl.reshape(c, [BN, D])


@triton.jit
def plane_gather(CP, row, rmask, perm, W: tl.constexpr, OFFU: tl.constexpr, STR: tl.constexpr, CFG: tl.constexpr,
                 BN: tl.constexpr, D: tl.constexpr):
    """A plane whose unit order differs from the main plane's (GGML q5: sequential qh vs strided
    qs) -> int32 [BN, D] in the main plane's column order (perm). Its NU units per group are
    loaded once as NU [BN, NG] tiles and each column picks its unit and bits in registers.
    (Per-element loads instead, one cached LDG per code, made q5_0 decode 23.7 ms at B=32 x 32K
    on H200 vs 2.9 ms for int5:g32:sym: 255 registers, 1 KB of spills.)"""
    G: tl.constexpr = CFG[1]
    NG: tl.constexpr = CFG[2]
    WORD: tl.constexpr = CFG[3]
    PB: tl.constexpr = G * W // 8      # plane bytes per group
    NU: tl.constexpr = PB // WORD      # plane units per group
    e = tl.reshape(perm % G, [NG, G])  # element (within its group) held by each column
    if STR:
        byte = e % PB
        m = e // PB
    else:
        byte = e // (8 // W)
        m = e % (8 // W)
    k = byte // WORD                   # unit of the group holding the element
    sh = (byte % WORD) * 8 + m * W     # its bit offset in that unit
    gu = tl.arange(0, NG) * CFG[20] + OFFU
    c = tl.zeros([BN, NG, G], tl.int32)
    for j in tl.static_range(NU):
        u = tl.load(CP + row[:, None] + (gu + j)[None, :], mask=rmask[:, None], other=0).to(tl.int32)  # [BN, NG]
        bits = (u[:, :, None] >> sh[None, :, :]) & ((1 << W) - 1)
        c = tl.where((k == j)[None, :, :], bits, c)
    return tl.reshape(c, [BN, D])


@triton.jit
def row_codes(CP, row, rmask, perm, CFG: tl.constexpr, BN: tl.constexpr, D: tl.constexpr):
    """All bit planes of BN rows combined -> int32 codes [BN, D] (column order = perm)."""
    if CFG[9]:
        c = plane_gather(CP, row, rmask, perm, CFG[5], CFG[7], CFG[8], CFG, BN, D) << CFG[6]
    else:
        c = plane_tile(CP, row, rmask, CFG[5], CFG[7], CFG, BN, D) << CFG[6]
    if CFG[4] > 1:
        if CFG[14]:
            c = c | (plane_gather(CP, row, rmask, perm, CFG[10], CFG[12], CFG[13], CFG, BN, D) << CFG[11])
        else:
            c = c | (plane_tile(CP, row, rmask, CFG[10], CFG[12], CFG, BN, D) << CFG[11])
    if CFG[4] > 2:
        if CFG[19]:
            c = c | (plane_gather(CP, row, rmask, perm, CFG[15], CFG[17], CFG[18], CFG, BN, D) << CFG[16])
        else:
            c = c | (plane_tile(CP, row, rmask, CFG[15], CFG[17], CFG, BN, D) << CFG[16])
    return c


# ---- whole tiles ---------------------------------------------------------------------------------
@triton.jit
def _tok_scales(SP, ZP, pg, slot, h, valid, s0, s1, s2, CFG: tl.constexpr, BN: tl.constexpr):
    """Scales and effective zeros (zero - offset * scale) of BN token rows -> two float32 [BN, NG]."""
    NG: tl.constexpr = CFG[2]
    srow = pg * s0 + h * s1 + slot * NG  # a tile's scales are contiguous within each page: wide loads
    gi = tl.arange(0, NG)
    s = scale_values(tl.load(SP + srow[:, None] + gi[None, :], mask=valid[:, None], other=0), CFG[24])
    if CFG[25]:
        z = tl.load(ZP + srow[:, None] + gi[None, :], mask=valid[:, None], other=0).to(tl.float32)
    else:
        z = tl.zeros([BN, NG], tl.float32)
    if CFG[23] != 0:
        z = z - CFG[23] * s
    return s, z


@triton.jit
def tok_tile(CP, SP, ZP, LUT, IDX, t0, L, h, perm, c0, c1, c2, s0, s1, s2, CFG: tl.constexpr, P: tl.constexpr,
             BN: tl.constexpr, D: tl.constexpr):
    """Tokens t0..t0+BN of one sequence (page ids at IDX), KV head h -> values [BN, D] (column
    order = perm; float32, fp16 on the ASM paths, the page dtype for bf16/fp16 pages).
    Rows past L read nothing and come out 0. Strides c*/s* are in load units / elements.
    (One return at the end: Triton compiles static branches, so no early returns.)"""
    t = t0 + tl.arange(0, BN)
    valid = t < L
    pg = tl.load(IDX + t // P, mask=valid, other=0).to(tl.int64)
    slot = t % P
    RU: tl.constexpr = D if CFG[0] == 0 else CFG[2] * CFG[20]  # units per row (constexpr: alignment is known)
    row = pg * c0 + h * c1 + slot * RU  # [BN] unit offset of each token's row
    if CFG[0] == 0:
        res = tl.load(CP + row[:, None] + tl.arange(0, D)[None, :], mask=valid[:, None], other=0.0)
    elif CFG[27]:  # GPU fast paths: fp16 tiles straight from the codes (dequant_half)
        s, z = half_scales(SP, ZP, pg * s0 + h * s1 + slot * CFG[2], valid, CFG, BN)
        if CFG[28]:
            res = byte_tile(CP, row, valid, s, z, CFG, BN, D)
        elif CFG[29]:
            res = nibble_rows(CP, row, valid, s, z, CFG, BN, D)
        else:
            res = nibble_tile(CP, row, valid, s, z, CFG, BN, D)
    else:
        x = code_values(row_codes(CP, row, valid, perm, CFG, BN, D), LUT, CFG[0])
        if CFG[24] != 0:
            s, z = _tok_scales(SP, ZP, pg, slot, h, valid, s0, s1, s2, CFG, BN)
            x3 = tl.reshape(x, [BN, CFG[2], CFG[1]]) * s[:, :, None] + z[:, :, None]
            res = tl.reshape(x3, [BN, D])
        elif CFG[23] != 0:
            res = x - CFG[23]
        else:
            res = x
    return res


@triton.jit
def _chan_plane(CP, IDX, t0, L, h, c0, c1, W: tl.constexpr, SH: tl.constexpr, OFFU: tl.constexpr,
                CFG: tl.constexpr, P: tl.constexpr, BN: tl.constexpr, D: tl.constexpr):
    """One bit plane of a channel-axis tile -> int32 [D, BN] codes (shifted into place)."""
    G: tl.constexpr = CFG[1]
    WORD: tl.constexpr = CFG[3]
    NU: tl.constexpr = G * W // 8 // WORD
    K: tl.constexpr = WORD * 8 // W
    NGT: tl.constexpr = BN // G
    d = tl.arange(0, D)
    cols = tl.arange(0, NGT * NU)
    tg = t0 + (cols // NU) * G  # first token of each column's group
    gm = tg < L
    pg = tl.load(IDX + tg // P, mask=gm, other=0).to(tl.int64)
    base = pg * c0 + h * c1 + ((tg % P) // G) * (D * CFG[20]) + OFFU + cols % NU
    u = tl.load(CP + base[None, :] + d[:, None] * CFG[20], mask=gm[None, :], other=0).to(tl.int32)  # [D, NGT*NU]
    if CFG[22]:
        u = u ^ (-2139062144 if WORD == 4 else (0x8080 if WORD == 2 else 0x80))
    sh = tl.arange(0, K) * W
    p = (u[:, :, None] >> sh[None, None, :]) & ((1 << W) - 1)
    return tl.reshape(p, [D, BN]) << SH


@triton.jit
def chan_tile(CP, SP, ZP, LUT, IDX, t0, L, h, c0, c1, c2, c3, s0, s1, s2, CFG: tl.constexpr, P: tl.constexpr,
              BN: tl.constexpr, D: tl.constexpr):
    """Channel-axis (KIVI) tile: token groups of G inside each channel -> float32 [D, BN] (K^T).
    t0 is a multiple of G; codes [N, Hk, P/G, D, GB] (c3 = channel stride), scales [N, Hk, P/G, D]."""
    G: tl.constexpr = CFG[1]
    NGT: tl.constexpr = BN // G
    d = tl.arange(0, D)
    c = _chan_plane(CP, IDX, t0, L, h, c0, c1, CFG[5], CFG[6], CFG[7], CFG, P, BN, D)
    if CFG[4] > 1:
        c = c | _chan_plane(CP, IDX, t0, L, h, c0, c1, CFG[10], CFG[11], CFG[12], CFG, P, BN, D)
    if CFG[4] > 2:
        c = c | _chan_plane(CP, IDX, t0, L, h, c0, c1, CFG[15], CFG[16], CFG[17], CFG, P, BN, D)
    x = code_values(c, LUT, CFG[0])
    if CFG[24] == 0:
        res = x - CFG[23]
    else:
        tj = t0 + tl.arange(0, NGT) * G
        jm = tj < L
        pj = tl.load(IDX + tj // P, mask=jm, other=0).to(tl.int64)
        sb = pj * s0 + h * s1 + ((tj % P) // G) * D
        s = scale_values(tl.load(SP + sb[None, :] + d[:, None], mask=jm[None, :], other=0), CFG[24])  # [D, NGT]
        if CFG[25]:
            z = tl.load(ZP + sb[None, :] + d[:, None], mask=jm[None, :], other=0).to(tl.float32)
        else:
            z = tl.zeros([D, NGT], tl.float32)
        if CFG[23] != 0:
            z = z - CFG[23] * s
        x3 = tl.reshape(x, [D, NGT, G]) * s[:, :, None] + z[:, :, None]
        res = tl.reshape(x3, [D, BN])
    return res
