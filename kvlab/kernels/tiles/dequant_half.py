"""GPU fast paths of the tile dequantization: codes -> fp16 dot operands, no fp32 intermediate.

Used by `dequant.tok_tile` when the spec's CFG has ASM set (tile_config(..., asm=True), never
under TRITON_INTERPRET=1, whose inline-asm support is missing):

- `byte_tile`: one 8-bit plane per row (q8_0, int8, fp8 e4m3/e5m2) read as a [BN, NG, G] byte
  tile (16-byte vectors per thread, scales broadcast along the last dim without shuffles).
  int8: inline PTX, 4 codes per instance: PRMT the bytes into the mantissa of 1024.0
  (0x64 high bytes), one f16x2 subtract of the magic, one f16x2 FMA with scale and zero.
  fp8: Triton's own fp8 -> fp16 conversion (cvt.rn.f16x2.e4m3x2 on sm_90; e5m2 is a shift).
- `nibble_tile`: 4-bit ints as int32 words [BN, NG, GW]: OR a nibble pair into 0x6400 halves
  (lop3), subtract 1024 and FMA with scale/zero in f16x2; columns come out (word, j, m) with
  nibble j + 4 m (tile_config's perm accounts for it).
Scales and zeros arrive as float32 [BN, NG] (zero already net of the code offset).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .layout import F_G, F_GBU, F_KIND, F_NG, F_OFFSET, F_SK, F_XOR8, F_ZERO


@triton.jit
def _half2_bits(x):
    """fp16 [...] -> int32 [...] holding the value twice (an f16x2 operand)."""
    b = x.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return b | (b << 16)


@triton.jit
def half_scales(SP, ZP, srow, valid, CFG: tl.constexpr, BN: tl.constexpr):
    """Scales and zeros of BN token rows (srow: [BN] offsets) -> fp16 [BN, NG] each (zeros 0 if none)."""
    NG: tl.constexpr = CFG[F_NG]
    gi = tl.arange(0, NG)
    if CFG[F_SK] == 0:
        s = tl.full([BN, NG], 1.0, tl.float16)
    else:
        raw = tl.load(SP + srow[:, None] + gi[None, :], mask=valid[:, None], other=0)
        if CFG[F_SK] == 3:
            s = raw.to(tl.float8e4nv, bitcast=True).to(tl.float16)
        elif CFG[F_SK] == 2:
            e = raw.to(tl.int32)
            s = tl.where(e == 255, float("nan"), (e << 23).to(tl.float32, bitcast=True)).to(tl.float16)
        else:
            s = raw.to(tl.float16)
    if CFG[F_ZERO]:
        z = tl.load(ZP + srow[:, None] + gi[None, :], mask=valid[:, None], other=0).to(tl.float16)
    else:
        z = tl.zeros([BN, NG], tl.float16)
    return s, z


@triton.jit
def byte_tile(CP, row, valid, s, z, CFG: tl.constexpr, BN: tl.constexpr, D: tl.constexpr):
    """8-bit codes of BN rows (row: [BN] byte offsets; CP a uint8 pointer), fp16 scales / zeros
    [BN, NG] -> fp16 [BN, D]: s * (code - OFFSET) + z."""
    G: tl.constexpr = CFG[F_G]
    NG: tl.constexpr = CFG[F_NG]
    cols = tl.arange(0, NG)[:, None] * G + tl.arange(0, G)[None, :]
    c = tl.load(CP + row[:, None, None] + cols[None, :, :], mask=valid[:, None, None], other=0)  # uint8 [BN, NG, G]
    if CFG[F_KIND] == 2:
        x = c.to(tl.float8e4nv, bitcast=True).to(tl.float16)
    elif CFG[F_KIND] == 3:
        x = (c.to(tl.uint16) << 8).to(tl.float16, bitcast=True)  # e5m2 is the top byte of an fp16
    else:
        s3 = tl.broadcast_to(s[:, :, None], [BN, NG, G])
        z3 = tl.broadcast_to(z[:, :, None], [BN, NG, G])
        if CFG[F_XOR8]:  # int8 two's complement: flip to offset binary, subtract 1024 + 128 -> the signed code
            x = tl.inline_asm_elementwise(asm=_BYTES_ASM_XOR, constraints=_BYTES_CONS, args=[c, s3, z3],
                                          dtype=tl.float16, is_pure=True, pack=4)
        else:  # unsigned codes; a symmetric offset (int8 sym stored unsigned) rides in the zero
            z3 = z3 - CFG[F_OFFSET] * s3
            x = tl.inline_asm_elementwise(asm=_BYTES_ASM_U8, constraints=_BYTES_CONS, args=[c, s3, z3],
                                          dtype=tl.float16, is_pure=True, pack=4)
    return tl.reshape(x, [BN, D])


@triton.jit
def nibble_tile(CP, row, valid, s, z, CFG: tl.constexpr, BN: tl.constexpr, D: tl.constexpr):
    """4-bit int codes of BN rows (row: [BN] int32-word offsets) -> fp16 [BN, D] in (word, j, m) order."""
    NG: tl.constexpr = CFG[F_NG]
    GW: tl.constexpr = CFG[F_GBU]  # words per group
    cols = tl.arange(0, NG)[:, None] * GW + tl.arange(0, GW)[None, :]
    u = tl.load(CP + row[:, None, None] + cols[None, :, :], mask=valid[:, None, None], other=0)  # [BN, NG, GW]
    x = u[:, :, :, None] >> (tl.arange(0, 4) * 4)[None, None, None, :]  # [BN, NG, GW, 4]
    s2 = tl.broadcast_to(_half2_bits(s)[:, :, None, None], [BN, NG, GW, 4])
    z2 = tl.broadcast_to(_half2_bits(z)[:, :, None, None], [BN, NG, GW, 4])
    # subtracting 1024 + OFFSET (q4_0: 1032 = 0x6408) in f16x2 leaves the signed code, exactly
    a, b = tl.inline_asm_elementwise(asm=_NIB_PAIR_ASM_8 if CFG[F_OFFSET] == 8 else _NIB_PAIR_ASM_0,
                                     constraints="=h,=h,r,r,r", args=[x, s2, z2], dtype=(tl.float16, tl.float16),
                                     is_pure=True, pack=1)
    return tl.reshape(tl.join(a, b), [BN, D])


@triton.jit
def nibble_rows(CP, row, valid, s, z, CFG: tl.constexpr, BN: tl.constexpr, D: tl.constexpr):
    """rowfirst variant of `nibble_tile` (config layout 'rowfirst'): the codes are read as a [BN, NG, GB] byte
    tile (CP uint8, row = [BN] byte offsets; 16-byte vectors per thread as in byte_tile); one asm op per 4
    bytes moves the high nibbles down (SHF + LOP3), tl.join puts each byte's two nibbles side by side in the
    thread, and the byte_tile conversion (AND 0x0F, PRMT into 0x64 high bytes, HSUB2 of 1024 + OFFSET, HFMA2
    with scale / zero) turns them into fp16 that stays contiguous per thread in the row layout.
    Column order (byte, nibble) = the plain path's with WORD 1 (tile_config's perm)."""
    G: tl.constexpr = CFG[F_G]
    NG: tl.constexpr = CFG[F_NG]
    GB: tl.constexpr = G // 2
    cols = tl.arange(0, NG * GB)
    c = tl.load(CP + row[:, None] + cols[None, :], mask=valid[:, None], other=0)  # uint8 [BN, row bytes]
    c = tl.reshape(c, [BN, NG, GB])
    hi = tl.inline_asm_elementwise(asm="shr.b32 $0, $1, 4;", constraints="=r,r", args=[c], dtype=tl.uint8,
                                   is_pure=True, pack=4)
    c2 = tl.reshape(tl.join(c, hi), [BN, NG, G])  # low 4 bits of each byte = the code; high bits masked below
    s3 = tl.broadcast_to(s[:, :, None], [BN, NG, G])
    z3 = tl.broadcast_to(z[:, :, None], [BN, NG, G])
    x = tl.inline_asm_elementwise(asm=_NIB_ROWS_ASM_8 if CFG[F_OFFSET] == 8 else _NIB_ROWS_ASM_0, constraints=_BYTES_CONS,
                                  args=[c2, s3, z3], dtype=tl.float16, is_pure=True, pack=4)
    return tl.reshape(x, [BN, D])


# Four bytes -> four fp16 per instance: PREP the bytes (u), PRMT them into the mantissa of 1024.0
# (0x64 high bytes), subtract MAGIC (1024 + the code offset) in f16x2, one f16x2 FMA with scale / zero.
_BYTES = """{
    .reg .b32 u, lo, hi, m;
    PREP
    mov.b32 m, 0x64646464;
    prmt.b32 lo, u, m, 0x4140;
    prmt.b32 hi, u, m, 0x4342;
    mov.b32 m, MAGIC;
    sub.f16x2 lo, lo, m;
    sub.f16x2 hi, hi, m;
    fma.rn.f16x2 $0, lo, $3, $5;
    fma.rn.f16x2 $1, hi, $4, $6;
    }"""


def _bytes_asm(prep: str, magic: str) -> tl.constexpr:
    return tl.constexpr(_BYTES.replace("PREP", prep).replace("MAGIC", magic))


_BYTES_CONS = tl.constexpr("=r,=r,r,r,r,r,r")
_BYTES_ASM_XOR = _bytes_asm("xor.b32 u, $2, 0x80808080;", "0x64806480")  # int8 two's complement: 1024 + 128
_BYTES_ASM_U8 = _bytes_asm("mov.b32 u, $2;", "0x64006400")               # unsigned bytes: 1024
_NIB_ROWS_ASM_8 = _bytes_asm("and.b32 u, $2, 0x0F0F0F0F;", "0x64086408")  # low nibbles, q4_0: 1024 + 8
_NIB_ROWS_ASM_0 = _bytes_asm("and.b32 u, $2, 0x0F0F0F0F;", "0x64006400")  # unsigned codes, zero explicit

# A nibble pair (bits 0-3 and 16-19 of the operand) -> two fp16: LOP3 into 0x6400 halves, subtract MAGIC.
_NIB_PAIR = """{
    .reg .b32 t, m;
    mov.b32 m, 0x64006400;
    lop3.b32 t, $2, 0x000F000F, m, 0xEA;
    mov.b32 m, MAGIC;
    sub.f16x2 t, t, m;
    fma.rn.f16x2 t, t, $3, $4;
    mov.b32 {$0, $1}, t;
    }"""
_NIB_PAIR_ASM_8 = tl.constexpr(_NIB_PAIR.replace("MAGIC", "0x64086408"))  # q4_0: subtract 1024 + 8
_NIB_PAIR_ASM_0 = tl.constexpr(_NIB_PAIR.replace("MAGIC", "0x64006400"))  # unsigned codes: 1024
