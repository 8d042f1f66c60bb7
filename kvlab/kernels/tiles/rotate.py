"""The Hadamard rotation of rotated specs (`rot=had`) inside a Triton kernel, bit-exact with the oracle.

`kvlab.quant.rotation.rotate` defines the rotated values a spec stores as a fast Walsh-Hadamard transform in
a fixed order of float32 operations (constant geometry: each stage maps a row x to [x_even + x_odd,
x_even - x_odd]; log2(D) stages; then one multiply by the float32 constant 1/sqrt(D)). `fwht_rows` runs the
same operations on a [BR, D] register tile, so the store reads the 16-bit tokens once and never writes a
float32 rotated copy. Each stage is a split of adjacent pairs, one add and one subtract an element, and a
join + transpose that Triton lowers to register moves and a shared-memory exchange (offline sm_90: about
17 instructions an element for a whole load-rotate-store of a [32, 128] tile; `benchmarks/NOTES_store.md`).
`fwht_rows_in_place` runs the same additions in place, exchanging pairs by xor: the store calls it (its own switch,
`store.triton.FWHT_IN_PLACE`, on since the H200 timed it); `fwht_rows` takes it behind `IN_PLACE` for the kernels
not yet timed with it (extend, the decode merge).

This module imports Triton; only Triton backends and other tiles import it.
"""
from __future__ import annotations

import triton
import triton.language as tl


# the stages in place by a pair exchange (`fwht_rows_in_place`: registers or warp shuffles) instead of split / join /
# transpose, whose stages on a lane's bit move the tile through shared memory. Offline sm_90, the int4_had store at
# 16-row tiles: 104 -> 56 registers, 31 -> 9 barriers, 148 -> 93 instructions an element (lm2: 25 -> 5 barriers; lm4:
# 72 -> 128 registers). On the H200 the store went 0.150 -> 0.296 of copy for int4_had, lm2 0.154 -> 0.201
# (runs/s23-5358204): the store uses it (`store.triton.FWHT_IN_PLACE`). Here False: extend and the decode merge keep
# the oracle's constant-geometry stages as written until a GPU run times them in place
IN_PLACE = tl.constexpr(False)


@triton.jit
def fwht_rows_in_place(x, BR: tl.constexpr, D: tl.constexpr, LOG: tl.constexpr, C: tl.constexpr):
    """`fwht_rows` with the stages in place: stage s pairs the elements whose index differs in bit s and leaves the
    sum at the one with bit s clear, the difference at the other. The oracle's stage (pairs on bit 0, the result's
    bit 0 moved to the top) pairs the same elements, original bit s at stage s, and after LOG rotations of a LOG-bit
    index every result is where this puts it; each element sees the same additions in the same order: same bits.
    The partner comes by a xor over the pair's axis of the bit patterns (in registers, or a warp shuffle where the
    bit is a lane's), the difference as the sum with the sign bit flipped (a - b is a + (-b) in IEEE arithmetic)."""
    for s in tl.static_range(LOG):
        y = tl.reshape(x, [BR, D >> (s + 1), 2, 1 << s])  # axis 2: bit s of the element index
        yb = y.to(tl.int32, bitcast=True)
        pb = yb ^ tl.xor_sum(yb, axis=2, keep_dims=True)  # the partner's bits
        hi = tl.arange(0, 2)[None, None, :, None]  # bit s of this element
        mine = (yb ^ (hi << 31)).to(tl.float32, bitcast=True)  # this element, negated where bit s is set
        x = tl.reshape(pb.to(tl.float32, bitcast=True) + mine, [BR, D])  # a + b at bit 0, a + (-b) at bit 1
    return x * C


@triton.jit
def fwht_rows(x, BR: tl.constexpr, D: tl.constexpr, LOG: tl.constexpr, C: tl.constexpr):
    """rotate(x) for a float32 tile x [BR, D] (D = 2^LOG, one Hadamard block a row); C: the float32 value of
    1/sqrt(D) (`kvlab.quant.rotation.norm_constant`). Same operations, same order as the oracle: same bits."""
    if IN_PLACE:
        y = fwht_rows_in_place(x, BR, D, LOG, C)
    else:
        for _ in tl.static_range(LOG):
            a, b = tl.split(tl.reshape(x, [BR, D // 2, 2]))  # [BR, D/2] even / odd elements
            x = tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 2, 1)), [BR, D])  # [sums, differences]
        y = x * C
    return y


@triton.jit
def byte_tiles(y, R: tl.constexpr, NB: tl.constexpr, K: tl.constexpr, ST: tl.constexpr):
    """The K element tiles [R, NB] of group rows y [R, NB * K] for packing K codes a byte: tile k holds element
    k * NB + j of byte j (ST, GGML-strided) or j * K + k (sequential). Returns four tiles (tile 0 repeated when K < 4,
    as the store's unrotated loads do)."""
    if K == 1:
        x0 = tl.reshape(y, [R, NB])
        x1, x2, x3 = x0, x0, x0
    elif K == 2:
        if ST:
            x0, x1 = tl.split(tl.permute(tl.reshape(y, [R, 2, NB]), (0, 2, 1)))
        else:
            x0, x1 = tl.split(tl.reshape(y, [R, NB, 2]))
        x2, x3 = x0, x0
    else:  # K == 4: k = 2 * k1 + k0
        if ST:
            z = tl.permute(tl.reshape(y, [R, 2, 2, NB]), (0, 3, 1, 2))  # [R, NB, k1, k0]
        else:
            z = tl.reshape(y, [R, NB, 2, 2])
        a, b = tl.split(z)  # k0 = 0, 1: [R, NB, k1]
        x0, x2 = tl.split(a)
        x1, x3 = tl.split(b)
    return x0, x1, x2, x3
