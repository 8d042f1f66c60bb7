"""How one cache tensor's codes reach a Triton tile: `TileCfg`, built from a spec by `tile_config`.

A spec reaches the decode and extend kernels as one constexpr tuple, so every spec family runs
through the same code and only constexpr branches differ. `TileCfg` names its fields on the host;
the kernels index the tuple with the `F_*` constants below (Triton's compiler and interpreter both
take a constexpr index into a constexpr tuple), so no kernel reads a bare position.

Codes are read as whole rows of load units (int32 words when the layout allows, else int16 /
uint8). Columns come out in "unit order" (unit u, sub-element k), which for GGML-strided nibbles
is a permutation of head_dim: `perm[col]` is the head_dim element held by column col.
"""
from __future__ import annotations

from typing import NamedTuple

import triton.language as tl

from ...quant.packing import plane_order

KINDS = {"bf16": 0, "fp16": 0, "int": 1, "fp8_e4m3": 2, "fp8_e5m2": 3, "fp4_e2m1": 4, "nf4": 5, "iq4nl": 5, "lm2": 5,
         "lm3": 5, "lm4": 5}
CAL_KIND = 5  # a calibrated int (`int<b>:cal`) reads its levels from the 16-entry table, as the codebooks
SCALE_KINDS = {"f16": 1, "bf16": 1, "f32": 1, "e8m0": 2, "e4m3": 3}


class TileCfg(NamedTuple):
    """Constexpr description of one cache tensor's tile (field order = the kernels' F_* indices)."""
    kind: int        # KINDS: 0 float storage, 1 int, 2 e4m3, 3 e5m2, 4 e2m1, 5 16-entry codebook
    g: int           # group size (elements along head_dim; tokens for axis chan)
    ng: int          # groups per row (1 for axis chan)
    word: int        # load unit in bytes (4, 2 or 1)
    n_planes: int    # bit planes (1..3)
    w0: int          # plane 0: bit width, shift into the code, offset (units), GGML-strided, gathered
    sh0: int
    off0: int
    str0: int
    gat0: int
    w1: int          # plane 1 (same five fields)
    sh1: int
    off1: int
    str1: int
    gat1: int
    w2: int          # plane 2
    sh2: int
    off2: int
    str2: int
    gat2: int
    gbu: int         # bytes of one group, in load units
    full: int        # one plane spans the row (one contiguous load)
    xor8: int        # int8 two's complement: flip to offset binary
    offset: int      # code offset of symmetric ints (2^(bits-1))
    scale_kind: int  # SCALE_KINDS (0: no group scale)
    has_zero: int
    chan: int        # axis chan (KIVI keys): tiles are [D, BN] token groups per channel
    asm: int         # GPU fp16 fast path (dequant_half)
    byte_rows: int   # one 8-bit plane read as a [BN, NG, G] byte tile (word 1)
    rows4: int       # rowfirst nibble unpack (dequant_half.nibble_rows)
    outl: int = 0    # outlier slots per token (`out=N`): written over the dequantized tile (attention.slot_values)


(F_KIND, F_G, F_NG, F_WORD, F_NP, F_W0, F_SH0, F_OFF0, F_STR0, F_GAT0, F_W1, F_SH1, F_OFF1, F_STR1, F_GAT1,
 F_W2, F_SH2, F_OFF2, F_STR2, F_GAT2, F_GBU, F_FULL, F_XOR8, F_OFFSET, F_SK, F_ZERO, F_CHAN, F_ASM, F_BYTES,
 F_ROWS, F_OUTL) = (tl.constexpr(i) for i in range(len(TileCfg._fields)))
PLANE_FIELDS = tl.constexpr(F_W1 - F_W0)  # plane k's fields sit at F_W0 + PLANE_FIELDS * k, ...


def _tile_order(w: int, G: int, word: int, r: int, strided: bool, asm: bool = False) -> int:
    """Element (within its group) of unit-order column r of a plane of width w."""
    K = word * 8 // w
    u, k = divmod(r, K)
    if asm and w == 4:  # asm path emits (unit, j, m) with nibble k = j + 4 m
        j, m = divmod(k, 2)
        k = j + 4 * m
    byte, m = u * word + k // (8 // w), k % (8 // w)
    return byte + m * (G * w // 8) if strided else byte * (8 // w) + m


def tile_config(spec, D: int, word_max: int = 4, asm: bool = False, rowfirst: bool = False) -> tuple[TileCfg, list[int]]:
    """(TileCfg, perm) for `spec` with head_dim D; perm[col] = head_dim element held by column col of a
    dequantized tile (identity except for GGML-strided planes). asm: allow the GPU fp16 fast paths;
    rowfirst: the fp16 tile is built in the load's row layout (config layout "rowfirst")."""
    if spec.is_float_storage:
        return TileCfg(0, D, 1, 1, 0, *(0,) * 15, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0), list(range(D))
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
    # fp8 keeps the plain byte-row path in the operand layout (its fp16 tile there reads V's bytes from smem
    # one at a time: benchmarks/NOTES_decode.md); rowfirst builds the fp16 tile in the row layout, so
    # fp8's cvt.rn.f16x2.e4m3x2 fast path is allowed there
    cal_int = spec.fmt == "int" and spec.calibrated  # a calibrated int: its code indexes the layer's levels (LUT)
    asm = bool(asm and not cal_int and spec.axis != "chan" and ((spec.fmt == "int" and ((spec.bits == 4 and word == 4) or byte_rows))
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
    sym_int = spec.fmt == "int" and spec.sym and not cal_int
    offset = 2 ** (spec.bits - 1) if sym_int else 0
    xor8 = int(sym_int and spec.bits == 8)
    sk = SCALE_KINDS[spec.scale_dtype] if spec.has_scale and spec.axis != "tensor" else 0
    cfg = TileCfg(CAL_KIND if cal_int else KINDS[spec.fmt], G, NG, word, len(planes), *fields, GB // word, int(len(planes) == 1), xor8, offset,
                  sk, int(not spec.sym), int(spec.axis == "chan"), int(asm), int(byte_rows), int(rows4),
                  spec.outliers)
    return cfg, perm
