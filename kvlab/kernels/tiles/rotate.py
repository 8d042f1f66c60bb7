"""The Hadamard rotation of rotated specs (`rot=had`) inside a Triton kernel, bit-exact with the oracle.

`kvlab.quant.rotation.rotate` defines the rotated values a spec stores as a fast Walsh-Hadamard transform in
a fixed order of float32 operations (constant geometry: each stage maps a row x to [x_even + x_odd,
x_even - x_odd]; log2(D) stages; then one multiply by the float32 constant 1/sqrt(D)). `fwht_rows` runs the
same operations on a [BR, D] register tile, so the store reads the 16-bit tokens once and never writes a
float32 rotated copy. Each stage is a split of adjacent pairs, one add and one subtract an element, and a
join + transpose that Triton lowers to register moves and a shared-memory exchange (offline sm_90: about
17 instructions an element for a whole load-rotate-store of a [32, 128] tile; `benchmarks/NOTES_store.md`).

This module imports Triton; only Triton backends and other tiles import it.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def fwht_rows(x, BR: tl.constexpr, D: tl.constexpr, LOG: tl.constexpr, C: tl.constexpr):
    """rotate(x) for a float32 tile x [BR, D] (D = 2^LOG, one Hadamard block a row); C: the float32 value of
    1/sqrt(D) (`kvlab.quant.rotation.norm_constant`). Same operations, same order as the oracle: same bits."""
    for _ in tl.static_range(LOG):
        a, b = tl.split(tl.reshape(x, [BR, D // 2, 2]))  # [BR, D/2] even / odd elements
        x = tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 2, 1)), [BR, D])  # [sums, differences]
    return x * C


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
