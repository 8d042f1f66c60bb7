"""The store's bracket for fixed ascending codebooks: a bin table (nf4, iq4nl, lm4), or arithmetic for fp4 e2m1.

The nearest of N ascending levels a_j = |s| cb[j] to x is decided, as the oracle decides it, by the float32 errors
|a_j - x| of the two levels around x (`kvlab.kernels.store.triton._sorted_codes` proves the farther ones never win).
The bisection that finds them costs about 30 selects and compares an element at N = 16. A table does it in one lookup: the range
[cb[0], cb[N-1]] is cut into K equal bins (x / |s| placed by one FMA), and bin g holds c_g, the level below every
midpoint that x in the bin (or within a thousandth of a bin of it) can fall past but one. So the nearest is c_g or
c_g + 1, decided by the two errors as before; ties keep the lower index, NaN gives 0. Out of range, the first bin
holds 0 and the last N - 2, so values below or above the levels clamp to them. Where x lies near a level, the
bracket may be one off without changing the answer (that level is nearer than the other either way), so only the
midpoints set K: the smallest power of two in 16..256 whose bins each hold at most one midpoint. Calibrated tables
(`cal`, per layer) keep the bisection: their table is data; so do lm2 / lm3, whose bisection of 2 or 3 steps beat
the table's three gathers on the H200 (`store.triton.lut_bins` has the numbers: nf4 0.195 -> 0.303 of copy, iq4nl 0.200
-> 0.332, mxfp4 0.305 -> 0.360, nvfp4 0.288 -> 0.343 at a 32K-token write).

The table lives after the 16 codebook entries of the store's float32 codebook buffer, as int32 bits. fp4 e2m1's
magnitudes need no table since session 30 (`e2m1_pow2_codes`, `e2m1_bracket_codes`: the level from t's float32 bits;
the table is what `store.triton.E2M1_POW2` / `E2M1_ARITH` off give back). This module imports Triton; only Triton
backends and other tiles import it.
"""
from __future__ import annotations

import functools

import triton
import triton.language as tl

LUT_OFFSET = tl.constexpr(16)  # float32 entries before the table: the codebook, padded to 16
BINS = (16, 32, 64, 128, 256)
SLACK = 1e-3  # of a bin: how far outside its bin the kernel's FMA may place x / |s| (it errs by ~1e-6 of a bin)


def bracket_table(levels: tuple[float, ...]) -> tuple[int, ...] | None:
    """c_g for the K bins of ascending float32 `levels` (N >= 2), K the smallest in BINS that works; None when none
    does (levels too uneven) or the levels are not strictly ascending."""
    n = len(levels)
    if n < 2 or any(b <= a for a, b in zip(levels, levels[1:])):
        return None
    mids = [(a + b) / 2 for a, b in zip(levels, levels[1:])]  # float64 from float32 levels
    lo, hi = levels[0], levels[-1]
    for k in BINS:
        w = (hi - lo) / k
        d = SLACK * w
        table = []
        for g in range(k):
            a, b = lo + g * w - d, lo + (g + 1) * w + d
            if sum(a <= m <= b for m in mids) > 1:
                break
            table.append(min(sum(m < a for m in mids), n - 2))
        else:
            if table[0] == 0 and table[-1] == n - 2:
                return tuple(table)
    return None


@functools.lru_cache(maxsize=64)
def bins_for(levels: tuple[float, ...]) -> int:
    """K for `levels` (0: no table; the store bisects)."""
    t = bracket_table(levels)
    return 0 if t is None else len(t)


def wide_table(levels: tuple[float, ...], table: tuple[int, ...]) -> list[tuple[int, float, float]]:
    """The K bins again as 16-byte entries (c_g, levels[c_g], levels[c_g + 1], 0), after the K int32 bins: `lut_codes`
    with WIDE reads a bin's index and both its levels in one vector load."""
    return [(c, levels[c], levels[c + 1]) for c in table]


@triton.jit
def lut_codes(x, s, cb_ptr, N: tl.constexpr, K: tl.constexpr, WIDE: tl.constexpr = False):
    """Index of the nearest s * cb[j] over the first N entries of an ascending codebook whose bracket table (K bins)
    follows its 16 entries: equal to `_sorted_codes` (and so to the full search where `_sorted_odd` is 0). A
    negative s flips x and s as there. x [..], s [.., 1]. WIDE (GPU only: inline PTX): the bin's index and its two
    levels in one 16-byte load an element from the wide entries (`wide_table`), an elementwise asm that keeps x's
    layout: a kernel holding a group in one thread (`store.triton_row_walk`) then needs no layout turn for the
    gathers, which Triton gives a layout of their own."""
    neg = s < 0
    sa = tl.abs(s)
    xs = tl.where(neg, -x, x)
    c0 = tl.load(cb_ptr)
    kr = K / (tl.load(cb_ptr + N - 1) - c0)
    gf = tl.fma(xs, kr / sa, -(c0 * kr))  # the bin of x / |s|, fractional
    gf = tl.where(gf == gf, gf, 0.0)  # NaN x (or 0 / 0): bin 0, whose two errors are NaN: code 0
    g = tl.minimum(tl.maximum(gf, 0.0), K - 1.0).to(tl.int32)
    if WIDE:
        w = (cb_ptr + LUT_OFFSET + K).to(tl.pointer_type(tl.int32)) + g * 4  # 16-byte aligned: (16 + K) x 4 bytes in
        c, lob, hib, _ = tl.inline_asm_elementwise(
            "ld.global.nc.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l", [w],
            dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)
        lo = sa * lob.to(tl.float32, bitcast=True)
        hi = sa * hib.to(tl.float32, bitcast=True)
    else:
        c = tl.load((cb_ptr + LUT_OFFSET).to(tl.pointer_type(tl.int32)) + g)
        lo = sa * tl.load(cb_ptr + c)
        hi = sa * tl.load(cb_ptr + c + 1)
    return c + (tl.abs(hi - xs) < tl.abs(lo - xs)).to(tl.int32)


@triton.jit
def e2m1_pow2_codes(a, s):
    """Index 0..7 of the nearest e2m1 magnitude (0, 0.5, 1, 1.5, 2, 3, 4, 6) times s to a = |x|, by arithmetic, for a
    scale s that is a power of two (mxfp4's e8m0 scale without a tensor scale): equal to `lut_codes` over the 8
    magnitudes where the store's rare check (`store.triton._e2m1_odd`) is 0, with no table read.
    Why it is exact: t = a * (1 / s) is exact (s in [2^-100, 2^100]; a t that underflows is far below the first
    midpoint), and s * level - a = s (level - t) rounds as level - t does, so the oracle compares the float32 errors
    level - t. Near a midpoint both are exact (Sterbenz: neighbouring levels are within a factor of 3, or the lower is
    0), so a code differs from the exactly nearest only at a midpoint itself, where the oracle's first index keeps the
    smaller magnitude. From 1 up the magnitudes are t's float32 bits rounded to one mantissa bit: adding 2^21 - 1
    below the kept bit carries past a remainder of more than half (a tie stays down), and the exponent and kept bit
    shifted out are the code plus 252 (1.0 -> 254), capped at 7 (t past 7 rounds to 8: 6 is the nearest). Below 1
    (0, 0.5, 1) the code is ceil(2 t - 1/2) (2 t exact; a tie k + 1/2 keeps k). NaN a gives 0. a [..], s [.., 1]."""
    t = a * tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), s)  # (one division a group)
    y = tl.math.ceil(tl.fma(t, 2.0, -0.5))
    low = tl.where(y == y, y, 0.0).to(tl.int32)  # (NaN t: 0)
    high = tl.minimum((t.to(tl.int32, bitcast=True) + (0x1FFFFF - (252 << 22))) >> 22, 7)
    return tl.where(t >= 1.0, high, low)


@triton.jit
def e2m1_bracket_codes(a, s):
    """Index 0..7 of the nearest e2m1 magnitude times s to a = |x| for any positive scale s (nvfp4's e4m3 scale times
    its tensor scale): `lut_codes` over the 8 magnitudes with the bin table's lookup and its three gathers replaced by
    arithmetic (the same codes). The two levels around t = a / s: from 1 up, t's float32 bits cut to one mantissa
    bit (lo) and lo's bits plus that bit (hi), t capped below 6 first so the last bracket is (4, 6); below 1, (0, 0.5)
    or (0.5, 1) by t >= 1/2; the lower level's code is its bits above bit 22 less 252 (1.0 -> 2). t's rounding (a times
    the rounded reciprocal) can put the bracket one below a level t lies on, never across a midpoint, so the nearest
    level is one of the two, as with the table; they are scaled and compared as `lut_codes` does (a tie keeps the
    lower, NaN a gives 0: NaN t takes the lower bracket and fails the compare). Launch with `enable_fp_fusion=False`
    (as `lut_codes`): a fused s * level - a skips the rounding of the product the oracle makes. a [..], s [.., 1]."""
    t = a * tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), s)
    lob = tl.minimum(t, 5.5).to(tl.int32, bitcast=True) & -0x400000  # (0xFFC00000: sign, exponent, one mantissa bit)
    big = t >= 1.0
    half = t >= 0.5
    lo = tl.where(big, lob.to(tl.float32, bitcast=True), tl.where(half, 0.5, 0.0))
    hi = tl.where(big, (lob + 0x400000).to(tl.float32, bitcast=True), tl.where(half, 1.0, 0.5))
    c = tl.where(big, (lob >> 22) - 252, half.to(tl.int32))
    return c + (tl.abs(s * hi - a) < tl.abs(s * lo - a)).to(tl.int32)
