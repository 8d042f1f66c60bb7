"""Shared Triton dequantization of one K/V tile, for the decode and extend kernels.

A spec reaches the kernels as one constexpr tuple `CFG` (`layout.TileCfg`, indexed by its F_*
constants), so every spec family runs through the same code: only the constexpr branches differ.

Codes are read as whole rows of load units (int32 words when the layout allows, else int16 /
uint8): a tile's units are one contiguous [BLOCK_N, row_units] load per bit plane, unpacked with
one shift and one mask per element. Columns come out in "unit order" (unit u, sub-element k),
which for GGML-strided nibbles is a permutation of head_dim: the caller permutes q's dims for K
and scatters the output's dims for V with `perm` (no shuffles in registers). Int codes become
floats with the fp32 magic number (OR into 2^23's mantissa, subtract 2^23) instead of a slow
int->float convert; zero point and scale then fold into one FMA.

This module imports Triton; only Triton backends import it.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..env import interpreting
from .dequant_half import byte_tile, half_scales, nibble_rows, nibble_tile
from .layout import (F_ASM, F_BYTES, F_FULL, F_G, F_GAT0, F_GBU, F_KIND, F_NG, F_NP, F_OFF0, F_OFFSET, F_ROWS, F_SH0,
                     F_SK, F_STR0, F_W0, F_WORD, F_XOR8, F_ZERO, PLANE_FIELDS)


# ---- element and scale values -------------------------------------------------------------------
# Triton's interpreter reads the e4m3fn NaN codes 0x7F / 0xFF as +-480; the GPU's conversion gives NaN. The
# interpreter alone gets the explicit NaN select, so the GPU code (and its speed) is the plain conversion.
INTERPRETED = tl.constexpr(interpreting())


@triton.jit
def e4m3_values(c):
    """e4m3fn codes (any int dtype, low byte) -> float32, NaN codes NaN on both backends."""
    b = c.to(tl.uint8)
    v = b.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    if INTERPRETED:
        v = tl.where((b & 0x7F) == 0x7F, float("nan"), v)
    return v


@triton.jit
def code_values(c, LUT, KIND: tl.constexpr):
    """int32 codes -> float32 element values (before scales)."""
    if KIND == 1:  # exact int -> float: 2^23 + c as bits, minus 2^23 (LOP3 + FADD, no I2F)
        x = (c | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
    elif KIND == 2:
        x = e4m3_values(c)
    elif KIND == 3:
        x = c.to(tl.uint8).to(tl.float8e5, bitcast=True).to(tl.float32)
    elif KIND == 4:  # e2m1 -> fp16 bits (sign at 15, exp+mantissa at 9..11), times 2^14 (exact, subnormals too)
        h = (((c & 8) << 12) | ((c & 7) << 9)).to(tl.int16).to(tl.float16, bitcast=True)
        x = h.to(tl.float32) * 16384.0
    else:  # codebook (nf4, iq4nl, lm2..lm4; 16-entry table): an L1-resident table
        x = tl.load(LUT + c)
    return x


@triton.jit
def scale_values(s, SK: tl.constexpr):
    """Stored scales -> float32 (SK: 1 float, 2 e8m0 biased exponent, 3 e4m3 bytes)."""
    if SK == 3:
        v = e4m3_values(s)
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
    G: tl.constexpr = CFG[F_G]
    NG: tl.constexpr = CFG[F_NG]
    WORD: tl.constexpr = CFG[F_WORD]
    NU: tl.constexpr = G * W // 8 // WORD
    K: tl.constexpr = WORD * 8 // W
    cols = tl.arange(0, NG * NU)
    if CFG[F_FULL]:
        offs = cols  # the plane is the whole row: one contiguous (vectorizable) load
    else:
        offs = (cols // NU) * CFG[F_GBU] + OFFU + cols % NU
    u = tl.load(CP + row[:, None] + offs[None, :], mask=rmask[:, None], other=0).to(tl.int32)  # [BN, NG*NU]
    if CFG[F_XOR8]:  # int8 two's complement -> offset binary, once per unit
        u = u ^ (-2139062144 if WORD == 4 else (0x8080 if WORD == 2 else 0x80))
    sh = tl.arange(0, K) * W
    c = (u[:, :, None] >> sh[None, None, :]) & ((1 << W) - 1)  # [BN, NG*NU, K]
    return tl.reshape(c, [BN, D])


@triton.jit
def plane_gather(CP, row, rmask, perm, W: tl.constexpr, OFFU: tl.constexpr, STR: tl.constexpr, CFG: tl.constexpr,
                 BN: tl.constexpr, D: tl.constexpr):
    """A plane whose unit order differs from the main plane's (GGML q5: sequential qh vs strided
    qs) -> int32 [BN, D] in the main plane's column order (perm). Its NU units per group are
    loaded once as NU [BN, NG] tiles and each column picks its unit and bits in registers (per-element
    loads instead spilled and ran 8x slower: benchmarks/NOTES_decode.md)."""
    G: tl.constexpr = CFG[F_G]
    NG: tl.constexpr = CFG[F_NG]
    WORD: tl.constexpr = CFG[F_WORD]
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
    gu = tl.arange(0, NG) * CFG[F_GBU] + OFFU
    c = tl.zeros([BN, NG, G], tl.int32)
    for j in tl.static_range(NU):
        u = tl.load(CP + row[:, None] + (gu + j)[None, :], mask=rmask[:, None], other=0).to(tl.int32)  # [BN, NG]
        bits = (u[:, :, None] >> sh[None, :, :]) & ((1 << W) - 1)
        c = tl.where((k == j)[None, :, :], bits, c)
    return tl.reshape(c, [BN, D])


@triton.jit
def _plane_codes(CP, row, rmask, perm, K: tl.constexpr, CFG: tl.constexpr, BN: tl.constexpr, D: tl.constexpr):
    """Bit plane K of BN rows, shifted into place -> int32 [BN, D] (column order = perm). A plane's five
    TileCfg fields follow plane 0's at a stride of PLANE_FIELDS."""
    F: tl.constexpr = PLANE_FIELDS * K
    if CFG[F_GAT0 + F]:
        c = plane_gather(CP, row, rmask, perm, CFG[F_W0 + F], CFG[F_OFF0 + F], CFG[F_STR0 + F], CFG, BN, D)
    else:
        c = plane_tile(CP, row, rmask, CFG[F_W0 + F], CFG[F_OFF0 + F], CFG, BN, D)
    return c << CFG[F_SH0 + F]


@triton.jit
def row_codes(CP, row, rmask, perm, CFG: tl.constexpr, BN: tl.constexpr, D: tl.constexpr):
    """All bit planes of BN rows combined -> int32 codes [BN, D] (column order = perm)."""
    c = _plane_codes(CP, row, rmask, perm, 0, CFG, BN, D)
    if CFG[F_NP] > 1:
        c = c | _plane_codes(CP, row, rmask, perm, 1, CFG, BN, D)
    if CFG[F_NP] > 2:
        c = c | _plane_codes(CP, row, rmask, perm, 2, CFG, BN, D)
    return c


# ---- whole tiles ---------------------------------------------------------------------------------
@triton.jit
def _tok_scales(SP, ZP, pg, slot, h, valid, s0, s1, s2, CFG: tl.constexpr, BN: tl.constexpr):
    """Scales and effective zeros (zero - offset * scale) of BN token rows -> two float32 [BN, NG]."""
    NG: tl.constexpr = CFG[F_NG]
    srow = pg * s0 + h * s1 + slot * NG  # a tile's scales are contiguous within each page: wide loads
    gi = tl.arange(0, NG)
    s = scale_values(tl.load(SP + srow[:, None] + gi[None, :], mask=valid[:, None], other=0), CFG[F_SK])
    if CFG[F_ZERO]:
        z = tl.load(ZP + srow[:, None] + gi[None, :], mask=valid[:, None], other=0).to(tl.float32)
    else:
        z = tl.zeros([BN, NG], tl.float32)
    if CFG[F_OFFSET] != 0:
        z = z - CFG[F_OFFSET] * s
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
    RU: tl.constexpr = D if CFG[F_KIND] == 0 else CFG[F_NG] * CFG[F_GBU]  # units per row (constexpr: alignment is known)
    row = pg * c0 + h * c1 + slot * RU  # [BN] unit offset of each token's row
    if CFG[F_KIND] == 0:
        res = tl.load(CP + row[:, None] + tl.arange(0, D)[None, :], mask=valid[:, None], other=0.0)
    elif CFG[F_ASM]:  # GPU fast paths: fp16 tiles straight from the codes (dequant_half)
        s, z = half_scales(SP, ZP, pg * s0 + h * s1 + slot * CFG[F_NG], valid, CFG, BN)
        if CFG[F_BYTES]:
            res = byte_tile(CP, row, valid, s, z, CFG, BN, D)
        elif CFG[F_ROWS]:
            res = nibble_rows(CP, row, valid, s, z, CFG, BN, D)
        else:
            res = nibble_tile(CP, row, valid, s, z, CFG, BN, D)
    else:
        x = code_values(row_codes(CP, row, valid, perm, CFG, BN, D), LUT, CFG[F_KIND])
        if CFG[F_SK] != 0:
            s, z = _tok_scales(SP, ZP, pg, slot, h, valid, s0, s1, s2, CFG, BN)
            x3 = tl.reshape(x, [BN, CFG[F_NG], CFG[F_G]]) * s[:, :, None] + z[:, :, None]
            res = tl.reshape(x3, [BN, D])
        elif CFG[F_OFFSET] != 0:
            res = x - CFG[F_OFFSET]
        else:
            res = x
    return res


@triton.jit
def _chan_plane(CP, IDX, t0, L, h, c0, c1, PL: tl.constexpr, CFG: tl.constexpr, P: tl.constexpr, BN: tl.constexpr,
                D: tl.constexpr):
    """Bit plane PL of a channel-axis tile -> int32 [D, BN] codes (shifted into place)."""
    W: tl.constexpr = CFG[F_W0 + PLANE_FIELDS * PL]
    SH: tl.constexpr = CFG[F_SH0 + PLANE_FIELDS * PL]
    OFFU: tl.constexpr = CFG[F_OFF0 + PLANE_FIELDS * PL]
    G: tl.constexpr = CFG[F_G]
    WORD: tl.constexpr = CFG[F_WORD]
    NU: tl.constexpr = G * W // 8 // WORD
    K: tl.constexpr = WORD * 8 // W
    NGT: tl.constexpr = BN // G
    d = tl.arange(0, D)
    cols = tl.arange(0, NGT * NU)
    tg = t0 + (cols // NU) * G  # first token of each column's group
    gm = tg < L
    pg = tl.load(IDX + tg // P, mask=gm, other=0).to(tl.int64)
    base = pg * c0 + h * c1 + ((tg % P) // G) * (D * CFG[F_GBU]) + OFFU + cols % NU
    u = tl.load(CP + base[None, :] + d[:, None] * CFG[F_GBU], mask=gm[None, :], other=0).to(tl.int32)  # [D, NGT*NU]
    if CFG[F_XOR8]:
        u = u ^ (-2139062144 if WORD == 4 else (0x8080 if WORD == 2 else 0x80))
    sh = tl.arange(0, K) * W
    p = (u[:, :, None] >> sh[None, None, :]) & ((1 << W) - 1)
    return tl.reshape(p, [D, BN]) << SH


@triton.jit
def chan_tile(CP, SP, ZP, LUT, IDX, t0, L, h, c0, c1, c2, c3, s0, s1, s2, CFG: tl.constexpr, P: tl.constexpr,
              BN: tl.constexpr, D: tl.constexpr):
    """Channel-axis (KIVI) tile: token groups of G inside each channel -> float32 [D, BN] (K^T).
    t0 is a multiple of G; codes [N, Hk, P/G, D, GB] (c3 = channel stride), scales [N, Hk, P/G, D]."""
    G: tl.constexpr = CFG[F_G]
    NGT: tl.constexpr = BN // G
    d = tl.arange(0, D)
    c = _chan_plane(CP, IDX, t0, L, h, c0, c1, 0, CFG, P, BN, D)
    if CFG[F_NP] > 1:
        c = c | _chan_plane(CP, IDX, t0, L, h, c0, c1, 1, CFG, P, BN, D)
    if CFG[F_NP] > 2:
        c = c | _chan_plane(CP, IDX, t0, L, h, c0, c1, 2, CFG, P, BN, D)
    x = code_values(c, LUT, CFG[F_KIND])
    if CFG[F_SK] == 0:
        res = x - CFG[F_OFFSET]
    else:
        tj = t0 + tl.arange(0, NGT) * G
        jm = tj < L
        pj = tl.load(IDX + tj // P, mask=jm, other=0).to(tl.int64)
        sb = pj * s0 + h * s1 + ((tj % P) // G) * D
        s = scale_values(tl.load(SP + sb[None, :] + d[:, None], mask=jm[None, :], other=0), CFG[F_SK])  # [D, NGT]
        if CFG[F_ZERO]:
            z = tl.load(ZP + sb[None, :] + d[:, None], mask=jm[None, :], other=0).to(tl.float32)
        else:
            z = tl.zeros([D, NGT], tl.float32)
        if CFG[F_OFFSET] != 0:
            z = z - CFG[F_OFFSET] * s
        x3 = tl.reshape(x, [D, NGT, G]) * s[:, :, None] + z[:, :, None]
        res = tl.reshape(x3, [D, BN])
    return res
