"""The store kernel: quantize, pack and scatter new tokens into pages, for every spec family.

One `@triton.jit` program; a spec reaches it only as constexprs (`kernel_params`), so a new
scheme is a spec change. Program (r, h, grp) takes BLOCK_R rows of head h:

* rows are tokens (axis tok / head / tensor, bf16 / fp16 copies): one row = D elements in D/G
  groups; tile [BLOCK_R, NGP, GP] for the group statistics;
* rows are channels (axis chan, KIVI keys): program grp owns tokens grp*G .. grp*G+G-1 (one
  channel group, consecutive slots from a multiple of G); one row = G tokens of one channel.

Single-plane token-row specs with int codes or codebooks take the group-row path
instead (constexpr FLAT, `_store_rows`): [BLOCK_R * NG groups, bytes] tiles, one per element of a
byte, read once, so statistics, codes and packed bytes share one layout.

Otherwise each bit plane (widths from `kvlab.quant.packing.plane_order`) is then reloaded as a
[BLOCK_R, NGP, bytes, elements-per-byte] tile whose last axis is the elements sharing one byte
(sequential `i = byte*K + k` or GGML-strided `i = k*NB + byte`), coded, shifted and summed
into bytes: one contiguous byte vector per group and plane.

Arithmetic mirrors `kvlab/quant/oracle.py` operation for operation in float32: divisions with
`tl.math.div_rn` (IEEE, the CPU oracle's and GGML's `/`), rounding modes and scale/fp8 dtypes
through `kvlab.kernels._triton_utils` (exact on GPU and interpreter), and the launch passes
`enable_fp_fusion=False` so no multiply-add is fused. On sm_90+ GPUs fp8 codes come from the
hardware conversion (constexpr HW), which rounds as the oracle does. rule=mse is not here (api.py uses the
reference). The autotune key is (head_dim, n_heads, spec constexprs) and the token count's bucket (TB), never the
token count itself.

Rotated specs (`rot=had`) with a power-of-two head_dim of one Hadamard block and token rows (constexpr ROT =
log2 D): the program loads its whole token rows once, rotates them in registers (`tiles.rotate.fwht_rows_in_place`:
the oracle's fixed-order additions, so the bits match) and cuts the rotated rows into its tiles; other rotated specs
are rotated by `kvlab.quant.rotation.rotate` before the launch (`fuses_rotation`).
"""
from __future__ import annotations

import functools
import os
import sys

import torch
import triton
import triton.language as tl

from ...quant.formats import CODEBOOKS, ELEM_EMAX, FP8_MAX, codebook16, codebook_absmax
from ...quant.packing import plane_order
from ...quant.rotation import norm_constant
from ..configs import T_BUCKETS, StoreConfig, fuses_rotation, t_bucket
from ..env import interpreting
from ..tiles.exact import (as_f32, bf16_round, encode_scale, narrow_float, next_pow2, rint_even, rint_i32_hw,
                           round_away)
from ..tiles.rotate import byte_tiles, fwht_rows, fwht_rows_in_place
from ..tiles.bracket import bins_for, bracket_table, e2m1_bracket_codes, e2m1_pow2_codes, lut_codes, wide_table

FMT_IDS = {"int": 0, "fp8_e4m3": 1, "fp8_e5m2": 2, "fp4_e2m1": 3, "nf4": 3, "iq4nl": 3, "lm2": 3, "lm3": 3, "lm4": 3,
           "bf16": 4, "fp16": 5}
SDT_IDS = {"f16": 0, "bf16": 1, "f32": 2, "e8m0": 3, "e4m3": 4}
RULE_IDS = {"absmax": 0, "signed": 1, "unit": 2, "full": 0, "rms": 3}  # full: absmax statistics, divisor 2^(b-1)
RND_IDS = {"even": 0, "away": 1, "up": 2}
# (128, *): a whole head_dim of channels for axis chan (32 tokens a row: smaller tiles were mostly per-program
# overhead, 242 vs 79 instructions an element offline); `_prune` drops them for D=128 token rows. Fewer warps on
# the same channel tile keep more of the reductions over tokens inside a thread (offline sm_90, kivi4, per element:
# 128 rows 4 warps 79.2, 2 warps 55.9; 64 rows 1 warp 54.9)
# Channel tiles of 32 rows on one warp keep every token reduction inside the warp (offline sm_90, kivi4: 94
# instructions an element and 3 barriers against 159 and 17 at 32x4; H200, runs/s23-5358204: kivi4 0.308 of copy at
# 32x1, 0.278 at 64x2, 0.185 at 128x4); int4_had ran fastest at 16 rows on two warps (0.325 against 0.291 on four,
# runs/s23b-5b4d313)
CANDIDATES = [StoreConfig(block_r=r, num_warps=w) for r, w in ((4, 2), (8, 4), (16, 4), (32, 4), (32, 8), (64, 8),
                                                               (128, 4), (128, 8), (64, 1), (64, 2), (128, 2),
                                                               (16, 1), (32, 1), (32, 2), (16, 2))]
# the exact fallbacks of rare tiles (IEEE division for scales past 2^+-100, the full codebook search);
# `python -m devtools.store_sass_offline --hot` compiles without them to count the path tiles take
CHAN_T = tl.constexpr(False)  # channel rows loaded as one [G, BLOCK_R] tile, turned in registers (slower: session 22)
# channel-axis rows over (head, channel) pairs, so a program of BLOCK_R > D rows spans heads: with 4 warps and 128
# channels of one head, Triton's layout puts the warps along the group's tokens and every statistic is a reduction
# across warps (53 barriers a program offline); over 512+ rows the warps run along channels. Off until timed
CHAN_HEADS = tl.constexpr(False)
# channel-axis element tiles loaded as [bytes, channels] and turned, not vectorized along channels (`_load_elems`),
# so each thread keeps its channels' tokens. Off until timed
CHAN_J = tl.constexpr(False)
RARE_PATHS = tl.constexpr(True)
# round-half-even int codes on sm_90+ GPUs by one `cvt.rni.s32.f32` and an integer clamp (constexpr HW) instead of
# the 2^23 trick, NaN select and float clamp (`_rounded`): int2:g32:asym 38.2 -> 32.2 instructions an element offline
# (sm_90, 32-row tiles). False: the float path on the GPU too (for `benchmarks/store_variants.py`)
HW_RINT = tl.constexpr(True)
# the inline exact fallback of a group-row tile: 0 keeps the float32 elements live across the rare check; 1 loads its
# (unrotated) inputs again (offline sm_90, 32-row tiles: nf4 128 -> 122 registers, mxfp4 152 -> 128; timed in
# session 22); 2 loads and codes them one element tile at a time (`_pack_exact_tiles`: nf4 -> 79, iq4nl -> 72, mxfp4
# -> 64, int3 -> 104; prepared, off until `benchmarks/h200_run.sh s23` times it). Rotated specs keep theirs (a second
# rotation in the fallback cost int4_had 104 -> 127 registers)
RARE_RELOAD = tl.constexpr(1)
# sequentially packed codes of 16-bit inputs load each byte's K elements as one word (`packed_loads`, constexpr PK):
# the per-element 2-byte loads left int2's store L1-bound on the H200 (ncu, runs/store-abb9ac7-b: L1/TEX 89%, SM 72%);
# offline sm_90 the word loads compile to 16-byte vectors with about the same instructions (int2 37.2 -> 35.2 an
# element). False: the per-element loads (for `benchmarks/store_variants.py`)
PACKED_LOADS = True
# the rare exact fallback of group-row specs in a second launch over flagged programs (`two_pass`); False: inline.
# Off: on the H200 the two launches were no faster (int4:g32:asym 0.187 -> 0.182 of copy, kivi4 0.127 -> 0.095, nf4
# 0.180 -> 0.219; runs/s17-adcc53c): what costs the 3x is the per-element rare check, which the main pass still makes
TWO_PASS = False
# writes of fewer tokens keep the fallback inline: a decode step's store (B tokens a layer) is launch-bound, where a
# second launch per layer and tensor would cost more than the slower kernel
TWO_PASS_MIN_TOKENS = 512
# fixed ascending codebooks (nf4, iq4nl, lm4, e2m1 magnitudes: `lut_bins`) find the two levels around x in a bin table
# (`tiles.bracket.lut_codes`: one lookup) instead of the bisection (`_sorted_codes`: ~30 selects an element at 16 levels);
# False: the bisection (for `benchmarks/store_variants.py`); calibrated tables always bisect
BRACKET_LUT = True
# group-row stores of sorted brackets check only the per-group rare terms where the group's scale bounds |x| / s
# (`kernel_params` BOUND); False: the per-element check as well (for `benchmarks/store_variants.py`)
BOUND_CHECK = True
# fp4 e2m1 codes under a power-of-two scale (e8m0, no tensor scale: mxfp4) by arithmetic (`tiles.bracket.e2m1_pow2_codes`,
# constexpr LUT -1: a product, two compares, a ceil, no table) instead of the bin table's three gathers an element:
# offline sm_90 hot path at 32x4 39.8 -> 27.5 instructions an element; H100, 32K-token write, of copy, table ->
# arithmetic: 32x4 0.486 -> 0.622, 16x4 0.392 -> 0.474 (sweeps/results/h100/runs/s30-store-d3d2fb3). False: the table
E2M1_POW2 = True
# fp4 e2m1 codes under other scales (nvfp4's e4m3 times a tensor scale) with the bracket and its two levels by arithmetic
# (`tiles.bracket.e2m1_bracket_codes`, constexpr LUT -2) instead of the bin table's lookup and gathers: offline 43.0 ->
# 38.2 instructions an element; H100 32x4 0.442 -> 0.452, 16x4 0.414 -> 0.416 of copy (same run: no worse)
E2M1_ARITH = True
# int specs dividing by an f16 scale compile no rare IEEE-division fallback and no check for it (`quotient_safe`);
# KVLAB_STORE_QSAFE=0 (read at import, for A/B runs) compiles them as for bf16 / f32 scales. H100, 32K-token write, of
# copy, with -> without (sweeps/results/h100/runs/s30b-store-725cea5/store_qsafe.txt): int2 32x4 0.615 -> 0.734,
# int4:g32:asym 0.689 -> 0.811, int3 (row walk) 0.615 -> 0.717, int4_had 0.516 -> 0.563, kivi4 (channel walk) 0.429 ->
# 0.503, kivi2 0.440 -> 0.563
QUOTIENT_SAFE = tl.constexpr(os.environ.get("KVLAB_STORE_QSAFE", "1") not in ("", "0"))
# sorted codebooks with f16 scales (nf4, iq4nl, lm2-lm4) code the rare groups (scale 0, NaN, inf) in closed form
# instead of a block-wide check and the full search (`codebook_safe`); KVLAB_STORE_CBSAFE=0 (read at import, for A/B
# runs) keeps the check. Offline sm_90 it trades the check's barriers (nf4 group-row 6 -> 1) for 1-3 more instructions
# an element (nf4 35.0 against a 32.0 hot path). H100, 32K-token write, of copy, without -> with
# (sweeps/results/h100/runs/s31-store-84d4744/store_cbsafe.txt): nf4 32x4 0.443 -> 0.500, 16x4 0.428 -> 0.513; iq4nl
# 32x4 0.457 -> 0.516, 16x4 0.382 -> 0.464. The row walk keeps its check unless `triton_row_walk.CODEBOOK_SAFE_WALK`
CODEBOOK_SAFE = tl.constexpr(os.environ.get("KVLAB_STORE_CBSAFE", "1") not in ("", "0"))


# rotated specs run the Hadamard stages in place (`tiles.rotate.fwht_rows_in_place`, a pair exchange by xor) instead of
# the oracle's split / join / transpose stages through shared memory: the same additions in the same order (same
# bits). H200, 32K-token write (runs/s23-5358204, 16x4 / 32x4): int4_had 0.150 / 0.107 -> 0.290 / 0.296 of copy,
# lm2 0.154 -> 0.201, lm3 0.127 -> 0.181, lm4 0.109 -> 0.203. False: the oracle's stages (`fwht_rows`)
FWHT_IN_PLACE = tl.constexpr(True)
# the group-row kernel reads a codebook's bin and its two levels by one 16-byte load an element on the GPU
# (`tiles.bracket.lut_codes` WIDE, as the row walk does) instead of three gathers, which Triton gave a layout of their
# own (shared-memory turns and barriers). Offline sm_90 at 32x4 (`python -m devtools.store_sass_offline nf4 iq4nl
# --block-rows 32 --warps 4 [--hot]`), hot path an element, barriers, registers with the rare paths: nf4 37.5 -> 32.0,
# 22 -> 6, 128 -> 121; iq4nl 36.5 -> 33.5, 2 -> 2, 124 -> 114. H100, of copy, gathers -> one load: nf4 32x4 0.420 ->
# 0.446, 16x4 0.389 -> 0.428; iq4nl 32x4 0.487 -> 0.458, 16x4 0.341 -> 0.384 (runs/s30-store-d3d2fb3); the table run
# after it put iq4nl at 0.504 with it at 32x4: within the runs' noise. False: gathers
WIDE_LUT = tl.constexpr(True)


@triton.jit
def _rotate_rows(x, BR: tl.constexpr, D: tl.constexpr, LOG: tl.constexpr, C: tl.constexpr):
    """rotate(x) for a float32 tile x [BR, D] of whole token rows, by `FWHT_IN_PLACE`'s stages (same bits)."""
    if FWHT_IN_PLACE:
        y = fwht_rows_in_place(x, BR, D, LOG, C)
    else:
        y = fwht_rows(x, BR, D, LOG, C)
    return y


def set_switches(**values) -> None:
    """Set the store kernels' compile-time switches (this module's `tl.constexpr` globals) by name, for benchmarks and
    offline tools, before anything compiles: a GPU fixes them per compiled kernel (Triton refuses one that changed
    afterwards). An unknown name raises ValueError naming the allowed ones."""
    here = sys.modules[__name__]
    for name, value in values.items():
        if not isinstance(getattr(here, name, None), tl.constexpr):
            allowed = sorted(k for k, v in vars(here).items() if isinstance(v, tl.constexpr))
            raise ValueError(f"unknown store switch {name!r}; allowed: {', '.join(allowed)}")
        setattr(here, name, tl.constexpr(value))
    default_config.cache_clear()  # its candidates follow CHAN_HEADS (`_prune`)


AUTOTUNE_KEY = ["TB", "D", "HK", "FMT", "BITS", "G", "CHAN", "SYM", "RULE", "RND", "RECIP", "SDT", "W0", "W1", "W2", "FLAT", "HW", "CBS",
                "LUT", "BOUND", "SAFE", "ROT", "PK", "TWO"]


@triton.jit
def _x_ptrs(x_ptr, r, g, i, h, grp, T, st, sh, sd, G: tl.constexpr, NG: tl.constexpr, D: tl.constexpr,
            CHAN: tl.constexpr):
    """Pointers and mask of x elements (row r, group g, element i of the group)."""
    if CHAN:  # row = channel; the group is G consecutive tokens
        off = (grp * G + i).to(tl.int64) * st + h * sh + r * sd
        m = (r < D) & (i < G)
    else:  # row = token; groups run along head_dim
        off = r.to(tl.int64) * st + h * sh + (g * G + i) * sd
        m = (r < T) & (g < NG) & (i < G)
    return x_ptr + off, m


@triton.jit
def _negated(a):
    """-a for a >= 0 by the sign bit: Triton's unary minus is 0 - a, which turns +0 into +0, not -0."""
    return (a.to(tl.int32, bitcast=True) | -2147483648).to(tl.float32, bitcast=True)


@triton.jit
def _first_at(c, i, N: tl.constexpr, AXIS: tl.constexpr):
    """The smallest index i where c holds along AXIS (N where it never does), keep-dims."""
    return tl.min(tl.where(c, i, N), axis=AXIS, keep_dims=True)


@triton.jit
def _neg_at(x, i, first, AXIS: tl.constexpr):
    """1 where the element at index `first` along AXIS has its sign bit set (-0 included), keep-dims."""
    return tl.max(((i == first) & (x.to(tl.int32, bitcast=True) < 0)).to(tl.int32), axis=AXIS, keep_dims=True)


@triton.jit
def _zero_signed(neg, like):
    """+0, or -0 where neg > 0: GGML keeps the first element equal to a zero extreme, sign included."""
    return tl.where(neg > 0, _negated(like * 0.0), 0.0)


@triton.jit
def _scales_out(s_raw, m_raw, scales_ptr, zeros_ptr, ts_ptr, unit, mask, SYM: tl.constexpr, STATIC: tl.constexpr,
                RULE: tl.constexpr, SDT: tl.constexpr, ELEM_INT: tl.constexpr, HAS_TS: tl.constexpr):
    """Encode and store the group scales (and zeros) -> (scale, zero as stored, effective scale) as float32."""
    s_val, s_code = encode_scale(s_raw, SDT, ELEM_INT)
    m_val = m_raw
    if not SYM:
        m_val, m_code = encode_scale(m_raw, SDT, True)
        tl.store(zeros_ptr + unit, m_code, mask=mask)
    if (not STATIC) and RULE != 2:
        tl.store(scales_ptr + unit, s_code, mask=mask)
    s_eff = s_val
    if HAS_TS:
        s_eff = s_val * tl.load(ts_ptr)
    return s_val, m_val, s_eff


@triton.jit
def _raw_scale(stat, m_raw, bad, ts_ptr, SDIV: tl.constexpr, HAS_TS: tl.constexpr):
    """The group statistic to (raw scale, raw zero): a non-finite element (bad) makes both NaN, as the oracle does (no
    per-element work); the scale is stat / SDIV (IEEE), under the tensor scale where the spec has one."""
    stat = tl.where(bad, float("nan"), stat)
    m_raw = tl.where(bad, float("nan"), m_raw)
    s_raw = tl.math.div_rn(stat, tl.full(stat.shape, SDIV, tl.float32))
    if HAS_TS:
        s_raw = tl.math.div_rn(s_raw, tl.full(stat.shape, 1.0, tl.float32) * tl.load(ts_ptr))
    return s_raw, m_raw


@triton.jit
def _group_stats(x, m, i, SYM: tl.constexpr, RULE: tl.constexpr, SDIV: tl.constexpr, GP: tl.constexpr):
    """Per-group raw scale and zero ([.., 1] keep-dims) from a [BR, NGP, GP] tile; a non-finite element (NaN,
    +-inf) makes its group's scale NaN, as the oracle does."""
    has_nan = tl.max((x != x).to(tl.int32), axis=2, keep_dims=True) > 0  # tl.max skips NaN: found apart
    if RULE == 3:  # rms (Lloyd-Max codebooks): sqrt(mean x^2), summed in float64 and rounded once (the oracle's)
        xd = tl.where(m, x, 0.0).to(tl.float64)
        n = tl.maximum(tl.sum(m.to(tl.float64), axis=2, keep_dims=True), 1.0)
        stat = tl.sqrt(tl.sum(xd * xd, axis=2, keep_dims=True) / n).to(tl.float32)
        has_nan = has_nan | (tl.max(tl.where(m, tl.abs(x), 0.0), axis=2, keep_dims=True) == float("inf"))
        stat = tl.where(has_nan, float("nan"), stat)
        mn = stat
    elif SYM:
        a = tl.where(m, tl.abs(x), 0.0)
        stat = tl.max(a, axis=2, keep_dims=True)
        has_nan = has_nan | (stat == float("inf"))  # an inf: the max |x| is inf
        if RULE == 1:  # GGML: the signed element of largest magnitude, first one on ties
            neg = _neg_at(x, i, _first_at(a == stat, i, GP, 2), 2)
            stat = tl.where(neg > 0, _negated(stat), stat)
        stat = tl.where(has_nan, float("nan"), stat)
        mn = stat
    else:
        mx = tl.max(tl.where(m, x, -float("inf")), axis=2, keep_dims=True)
        mn = tl.min(tl.where(m, x, float("inf")), axis=2, keep_dims=True)
        empty = (mx == -float("inf")) & (mn == float("inf"))  # a masked-out row: keep its (unstored) math finite
        has_nan = has_nan | ((mx == float("inf")) | (mn == -float("inf"))) & ~empty  # an inf element
        mx = tl.where(has_nan, float("nan"), tl.where(empty, 0.0, mx))
        mn = tl.where(has_nan, float("nan"), tl.where(empty, 0.0, mn))
        if tl.max(((mx == 0) | (mn == 0)).to(tl.int32)) > 0:  # rare: a zero extreme takes the first zero's sign (GGML)
            zero = _zero_signed(_neg_at(x, i, _first_at(m & (x == 0), i, GP, 2), 2), mx)
            mx = tl.where(mx == 0, zero, mx)
            mn = tl.where(mn == 0, zero, mn)
        stat = mx - mn
    return tl.math.div_rn(stat, tl.full(stat.shape, SDIV, tl.float32)), mn


@triton.jit
def _rounded(v, RND: tl.constexpr, OFF: tl.constexpr, QMAX: tl.constexpr):
    """int32 code of a NaN-free quotient v by the spec's rounding, plus OFF, clamped to [0, QMAX] (exact float ops)."""
    if RND == 2:  # GGML: trunc(v + off + 0.5), clamped: the clamp at 0 and the int conversion's truncation
        r = v + (OFF + 0.5)  # of the non-negative result give exactly that (trunc(r) <= 0 iff r < 1)
    elif RND == 1:  # +-inf (an overflowing reciprocal) is +-FLT_MAX in the oracle (nan_to_num): saturate
        r = round_away(tl.minimum(tl.maximum(v, -16777216.0), 16777216.0)) + OFF  # first (integers past 2^24)
    else:
        r = rint_even(v) + OFF
    return tl.minimum(tl.maximum(r, 0.0), QMAX * 1.0).to(tl.int32)  # r is never NaN here


@triton.jit
def _codes(x, s_raw, s_val, m_raw, m_val, s_eff, cb_ptr, FMT: tl.constexpr, SYM: tl.constexpr, RULE: tl.constexpr,
           RND: tl.constexpr, RECIP: tl.constexpr, OFF: tl.constexpr, QMAX: tl.constexpr, XORC: tl.constexpr,
           HW: tl.constexpr, CBS: tl.constexpr, MODE: tl.constexpr = 0, LUT: tl.constexpr = 0,
           WIDE: tl.constexpr = False):
    """Unsigned int32 codes of x (per-group tensors broadcast against x). HW: the GPU's conversions (fp8 codes, and
    round-half-even int codes by `cvt.rni`), sm_90+ GPUs only.
    CBS: how a codebook code is found: 0 the 16-entry search, 1 fp4 e2m1 in GGML order (a binary search over its
    magnitudes), N >= 2 an ascending codebook of N levels (a binary search over the scaled levels; with FMT 0, a
    calibrated int's levels over x - zero); both with the search as a rare exact fallback. MODE 0: the fast path, and the exact one for the whole tile where `_odd` holds anywhere in it
    (one block-wide check); 1: the fast path only (the caller checks `_odd` itself, once for several tiles); 2: the
    exact path only; 3 (sorted codebooks, `codebook_safe`): the fast path with the odd-scale groups' codes in closed
    form (`_odd_scale_codes`), no check. LUT > 0: a fixed codebook's two levels around x come from its bin table of LUT bins
    (`tiles.bracket.lut_codes`), not the bisection (the same codes); WIDE (with HW): in one 16-byte PTX load."""
    if FMT == 0 and CBS >= 2:  # a calibrated int: the nearest of its CBS levels scaled by the stored scale, as the
        num = x if SYM else x - m_val  # codebooks (the oracle's |s * t_j - (x - m)|; no offset, no two's complement)
        if MODE == 2:
            u = _cb_search(num, s_val, cb_ptr)
        else:
            u = _sorted_codes(num, s_val, cb_ptr, CBS)
            if RARE_PATHS and MODE == 0:
                if tl.max(_sorted_odd(num, s_val, cb_ptr, CBS).to(tl.int32)) > 0:  # rare: an odd scale or level gap
                    u = _cb_search(num, s_val, cb_ptr)
    elif FMT == 0:
        if RECIP:  # GGML: multiply by the fp32 reciprocal of the unrounded scale
            nz = s_raw == 0
            den = tl.where(nz, 1.0, s_raw)
            inv = tl.where(nz, 0.0, tl.math.div_rn(tl.full(den.shape, 1.0, tl.float32), den))
            v = x * inv if SYM else (x - m_raw) * inv
        else:  # divide by the scale as stored: the IEEE quotient x / s, by Markstein's correction of x * (1 / s)
            num = x if SYM else x - m_val
            nz = s_val == 0
            den = tl.where(nz, 1.0, s_val)  # [.., 1] per group
            inv = tl.where(nz, 0.0, tl.math.div_rn(tl.full(den.shape, 1.0, tl.float32), den))  # one division a group
            v = _quotient(num, den, inv)
            if MODE == 2:
                num_b, den_b = tl.broadcast(num, den)
                v = tl.where(nz, 0.0, tl.math.div_rn(num_b, den_b))
            elif RARE_PATHS and MODE == 0:
                if tl.max(_inv_odd(inv).to(tl.int32)) > 0:  # rare: a scale past 2^+-100, IEEE division
                    num_b, den_b = tl.broadcast(num, den)
                    v = tl.where(nz, 0.0, tl.math.div_rn(num_b, den_b))
        if HW and HW_RINT and RND == 0:  # the GPU's cvt.rni (ties to even, NaN -> 0 as the oracle's nan_to_num, saturating):
            # one conversion and an integer clamp instead of the 2^23 trick's eleven instructions an element
            u = tl.minimum(tl.maximum(rint_i32_hw(v), -OFF), QMAX - OFF) + OFF
        else:
            v = tl.where(v != v, 0.0, v)
            u = _rounded(v, RND, OFF, QMAX)
        if XORC:  # two's-complement codes (8-bit symmetric, or `twos`): flip the offset's top bit
            u = u ^ XORC
    elif FMT <= 2:
        if RULE == 2:
            y = x
        else:
            nz = s_val == 0
            num, den = tl.broadcast(x, tl.where(nz, 1.0, s_val))
            y = tl.where(nz, 0.0, tl.math.div_rn(num, den))
        y = tl.where(tl.abs(x) < float("inf"), y, float("nan"))  # non-finite input: NaN, never a saturated code
        yb = y.to(tl.int32, bitcast=True)
        if FMT == 1:
            y = tl.where(y > 448.0, 448.0, tl.where(y < -448.0, -448.0, y))
        else:
            y = tl.where(y > 57344.0, 57344.0, tl.where(y < -57344.0, -57344.0, y))
        if HW:  # the GPU's cvt.rn.satfinite (round to nearest even, subnormals kept); NaN keeps its sign as torch's
            f8 = y.to(tl.float8e4nv) if FMT == 1 else y.to(tl.float8e5)
            u = f8.to(tl.uint8, bitcast=True).to(tl.int32)
            u = tl.where(y != y, 0x7F | ((yb >> 24) & 0x80), u)  # sign from before the clamp, which drops it
        elif FMT == 1:  # the interpreter's fp8 casts are not round-to-nearest-even: integer emulation
            _, u = narrow_float(y, 3, -6, 8, 8, 0x7F)
        else:
            _, u = narrow_float(y, 2, -14, 15, 8, 0x7F)
    elif CBS >= 1 and MODE == 2:
        u = _cb_search(x, s_eff, cb_ptr)
    elif CBS == 1:  # fp4 e2m1 (GGML index order): the magnitude by the binary search over the 8 ascending scaled
        # magnitudes cb[0..7] (a tie keeps the smaller, as the search's first index), the sign as index + 8 (-0 is 0)
        if LUT == -1:  # a power-of-two scale (mxfp4): by arithmetic, no table (`E2M1_POW2`)
            mag = e2m1_pow2_codes(tl.abs(x), s_eff)
        elif LUT == -2:  # any scale (nvfp4): the bracket and its levels by arithmetic, no table (`E2M1_ARITH`)
            mag = e2m1_bracket_codes(tl.abs(x), tl.abs(s_eff))
        elif LUT > 0:
            mag = lut_codes(tl.abs(x), s_eff, cb_ptr, 8, LUT, HW and WIDE)
        else:
            mag = _sorted_codes(tl.abs(x), s_eff, cb_ptr, 8)
        u = tl.where((x < 0) & (mag > 0), mag + 8, mag)
        if RARE_PATHS and MODE == 0:
            if tl.max(_e2m1_odd(x, s_eff, cb_ptr).to(tl.int32)) > 0:  # rare: an odd scale or |x| far past 6 s
                u = _cb_search(x, s_eff, cb_ptr)
    elif CBS >= 2:  # an ascending codebook of CBS levels (nf4, iq4nl, Lloyd-Max): a binary search, as the search picks
        if LUT > 0:
            u = lut_codes(x, s_eff, cb_ptr, CBS, LUT, HW and WIDE)
        else:
            u = _sorted_codes(x, s_eff, cb_ptr, CBS)
        if MODE == 3:  # an f16 scale bounding its group: the rare groups (scale 0, NaN, inf) in closed form
            u = _odd_scale_codes(u, s_eff, cb_ptr)
        elif RARE_PATHS and MODE == 0:
            if tl.max(_sorted_odd(x, s_eff, cb_ptr, CBS).to(tl.int32)) > 0:  # rare: an odd scale, |x| far out of range
                u = _cb_search(x, s_eff, cb_ptr)
    else:
        u = _cb_search(x, s_eff, cb_ptr)
    return u


@triton.jit
def _odd(x, s_raw, s_val, m_raw, m_val, s_eff, cb_ptr, FMT: tl.constexpr, SYM: tl.constexpr, RECIP: tl.constexpr,
         OFF: tl.constexpr, CBS: tl.constexpr, BOUND: tl.constexpr = False):
    """int32 1 where `_codes`' fast path (MODE 1) may differ from its exact one (MODE 2), 0 elsewhere; all 0 for the
    formats without a fast path (GGML's reciprocal ints, fp8, the full codebook search). BOUND: the group's own scale
    bounds every |x| / s far inside the bracket's 32 times its largest level (`kernel_params`), so only the per-group
    terms are checked (x is not read; the result is per group, [.., 1])."""
    if BOUND:
        x = s_val * 0.0
        if FMT == 0:
            m_val = x
        else:
            x = s_eff * 0.0
    if FMT == 0 and CBS >= 2:  # a calibrated int: the sorted-level bracket, on x - zero
        odd = _sorted_odd(x if SYM else x - m_val, s_val, cb_ptr, CBS)
    elif FMT == 0 and not RECIP:  # per group: Markstein's quotient is exact unless the reciprocal is out of range
        nz = s_val == 0
        inv = tl.where(nz, 0.0, tl.math.div_rn(tl.full(s_val.shape, 1.0, tl.float32), tl.where(nz, 1.0, s_val)))
        odd = _inv_odd(inv)
    elif CBS == 1:
        odd = _e2m1_odd(x, s_eff, cb_ptr)
    elif CBS >= 2:
        odd = _sorted_odd(x, s_eff, cb_ptr, CBS)
    else:
        odd = x != x
        odd = odd & ~odd  # all false
    return odd.to(tl.int32)


@triton.jit
def _quotient(num, den, inv):
    """The IEEE float32 quotient num / den from inv = RN(1 / den) with two FMAs (Markstein): q = RN(num * inv) is
    within an ulp of num / den, so r = num - q den is exact in one FMA and RN(q + r inv) is the correctly rounded
    quotient, for den's reciprocal within 2^+-100 (`_inv_odd`; the remainder stays normal where the code's rounding
    depends on it, |num / den| >= 1/2); an infinite or NaN q (num infinite or NaN) is the quotient as it is.
    Replaces a per-element near-half-integer check whose exact fallback ran in 92% of 32-row programs on bf16 inputs
    (benchmarks/NOTES_store.md, session 17). inv = 0 (a zero scale) gives 0."""
    q = num * inv
    return tl.where(tl.abs(q) < float("inf"), tl.fma(tl.fma(-q, den, num), inv, q), q)  # (an infinite num: q)


def _safe_mode(p: dict) -> int:
    """The kernels' constexpr SAFE for constexprs p: 1 where the int division needs no rare fallback
    (`quotient_safe`), 2 where a sorted codebook's rare groups are coded in closed form (`codebook_safe`), else 0."""
    f16 = p["SDT"] == 0 and not p["HAS_TS"]
    if QUOTIENT_SAFE and f16 and p["FMT"] == 0 and not p["RECIP"] and p["CBS"] < 2:
        return 1
    if CODEBOOK_SAFE and f16 and p["FMT"] == 3 and p["CBS"] >= 2 and p["BOUND"]:
        return 2
    return 0


def quotient_safe(p: dict) -> bool:
    """Whether an int spec's division by its stored scale (`_quotient`) can never need the rare exact fallback, so
    the kernels compile neither it nor its check (constexpr SAFE 1, `_safe_mode`): an f16 scale without a tensor scale is 0, inf,
    NaN or within [2^-24, 65504], so its reciprocal is 0, NaN or within 2^+-24, inside Markstein's 2^+-100
    (`_inv_odd` is 0 for every group). Offline sm_90, group-row 32x4, instructions an element with the fallback and
    its block-wide check compiled in -> without: int2:g32:asym 41.5 -> 19.5 (registers 56 -> 48, barriers 2 -> 0);
    see `benchmarks/NOTES_store.md`, session 30."""
    return p["SAFE"] == 1


def codebook_safe(p: dict) -> bool:
    """Whether a sorted-codebook spec's rare exact fallback (the full search) and its block-wide check can give way to
    per-element selects (constexpr SAFE 2, `_safe_mode`; `_codes` MODE 3): an f16 scale from the group's own statistics (`BOUND`:
    every |x| / s far inside the bracket) without a tensor scale is 0, inf, NaN or within [2^-24, 65504], so the check
    flags only scales of 0, NaN or inf, whose search results are fixed (`_odd_scale_codes`); fixed codebooks' levels are
    always far enough apart (the check's other term). nf4, iq4nl, lm2-lm4 with their f16 scales (with
    `CODEBOOK_SAFE`, on by default; the row walk takes it only with its own `CODEBOOK_SAFE_WALK`)."""
    return p["SAFE"] == 2


@triton.jit
def _odd_scale_codes(u, s, cb_ptr):
    """u, with the codes the full search (`_cb_search`, the oracle's rule) gives where the group scale s is 0, NaN or
    inf: 0 for a zero scale (every error |x|) or a NaN one (every error NaN); for an infinite scale and finite x (a
    non-finite x makes the scale NaN) every error is inf but a zero level's, which is NaN and counts as smallest: the
    first zero level (nf4's 7), or 0 where the codebook has none. u [..], s [.., 1]."""
    zi = 0
    found = 0
    for j in tl.static_range(16):
        hit = (tl.load(cb_ptr + j) == 0.0) & (found == 0)
        zi = tl.where(hit, j, zi)
        found = tl.where(hit, 1, found)
    flat = (s == 0.0) | (s != s)  # per group: one override code and one flag, then one select an element
    odd = flat | (tl.abs(s) == float("inf"))
    return tl.where(odd, tl.where(flat, 0, zi), u)


@triton.jit
def _inv_odd(inv):
    """Per group: 1 where the reciprocal of the scale is out of `_quotient`'s range (past 2^100, or below 2^-100 and
    not 0)."""
    return (inv > 1.2676506002282294e30) | ((inv < 7.888609052210118e-31) & (inv > 0.0))


@triton.jit
def _cb_search(x, s_eff, cb_ptr):
    """Index of the nearest s * cb[j] over the 16-entry codebook: first index on ties, NaN counts as smallest
    (torch.argmin), errors |s * cb[j] - x| in float32 as the oracle."""
    best = tl.abs(s_eff * tl.load(cb_ptr) - x)
    u = tl.zeros(best.shape, tl.int32)
    for j in tl.static_range(1, 16):
        e = tl.abs(s_eff * tl.load(cb_ptr + j) - x)
        better = (e < best) | ((e != e) & (best == best))
        u = tl.where(better, j, u)
        best = tl.where(better, e, best)
    return u


@triton.jit
def _level(cb_ptr, s, j):
    """s * cb[j] (s [.., 1] per group): the scaled level as `_cb_search` computes it."""
    return s * tl.load(cb_ptr + j)


@triton.jit
def _narrow(xs, t, lo, hi):
    """One step of `_sorted_codes`' bisection at threshold t: (xs >= t, the bracket's new lower and upper levels)."""
    ge = xs >= t
    return ge, tl.where(ge, t, lo), tl.where(ge, hi, t)


@triton.jit
def _sorted_codes(x, s, cb_ptr, N: tl.constexpr):
    """Index of the nearest s * cb[j] over the first N (4, 8 or 16) entries of an ascending codebook, equal to
    `_cb_search` where `_sorted_odd` is 0. A negative s flips x and s (s * cb[j] - x = -(|s| cb[j] - (-x)) exactly),
    so the scaled levels a_j = |s| cb[j] ascend. A binary search (log2 N compares; each level's threshold picked by
    selects over the previous answers) brackets a_i <= x' < a_i+1 (i = 0 below a_1, N - 1 from a_N-1 on); the
    farther levels' float32 errors are strictly larger (levels at least 2^-16 of the largest apart, |x| within 32
    times the largest: rounding is ~2^-18 of it), so only the two neighbours' errors, computed as the search computes them,
    decide, a tie keeping the lower index as the search's first index does; NaN x gives 0 as the search. x [..],
    s [.., 1]."""
    neg = s < 0
    sa = tl.abs(s)
    xs = tl.where(neg, -x, x)
    zero = xs * 0.0
    lo = _level(cb_ptr, sa, 0) + zero
    hi = _level(cb_ptr, sa, N - 1) + zero
    if N == 16:
        ge1, lo, hi = _narrow(xs, _level(cb_ptr, sa, 8) + zero, lo, hi)
        ge2, lo, hi = _narrow(xs, tl.where(ge1, _level(cb_ptr, sa, 12), _level(cb_ptr, sa, 4)), lo, hi)
        t = tl.where(ge1, tl.where(ge2, _level(cb_ptr, sa, 14), _level(cb_ptr, sa, 10)),
                     tl.where(ge2, _level(cb_ptr, sa, 6), _level(cb_ptr, sa, 2)))
        ge3, lo, hi = _narrow(xs, t, lo, hi)
        t = tl.where(ge1, tl.where(ge2, tl.where(ge3, _level(cb_ptr, sa, 15), _level(cb_ptr, sa, 13)),
                                   tl.where(ge3, _level(cb_ptr, sa, 11), _level(cb_ptr, sa, 9))),
                     tl.where(ge2, tl.where(ge3, _level(cb_ptr, sa, 7), _level(cb_ptr, sa, 5)),
                              tl.where(ge3, _level(cb_ptr, sa, 3), _level(cb_ptr, sa, 1))))
        ge4, lo, hi = _narrow(xs, t, lo, hi)
        idx = ge1.to(tl.int32) * 8 + ge2.to(tl.int32) * 4 + ge3.to(tl.int32) * 2 + ge4.to(tl.int32)
    elif N == 8:
        ge1, lo, hi = _narrow(xs, _level(cb_ptr, sa, 4) + zero, lo, hi)
        ge2, lo, hi = _narrow(xs, tl.where(ge1, _level(cb_ptr, sa, 6), _level(cb_ptr, sa, 2)), lo, hi)
        t = tl.where(ge1, tl.where(ge2, _level(cb_ptr, sa, 7), _level(cb_ptr, sa, 5)),
                     tl.where(ge2, _level(cb_ptr, sa, 3), _level(cb_ptr, sa, 1)))
        ge3, lo, hi = _narrow(xs, t, lo, hi)
        idx = ge1.to(tl.int32) * 4 + ge2.to(tl.int32) * 2 + ge3.to(tl.int32)
    else:  # N == 4
        ge1, lo, hi = _narrow(xs, _level(cb_ptr, sa, 2) + zero, lo, hi)
        ge2, lo, hi = _narrow(xs, tl.where(ge1, _level(cb_ptr, sa, 3), _level(cb_ptr, sa, 1)), lo, hi)
        idx = ge1.to(tl.int32) * 2 + ge2.to(tl.int32)
    up = (tl.abs(hi - xs) < tl.abs(lo - xs)) & (idx < N - 1)
    return idx + up.to(tl.int32)


@triton.jit
def _sorted_odd(x, s, cb_ptr, N: tl.constexpr):
    """1 where `_sorted_codes` may differ from the full search: |s| outside [2^-100, 2^100] (zero, NaN, inf,
    subnormal products), |x| past 32 times the largest scaled level, or a codebook whose levels are not at least 2^-16
    of its largest magnitude apart (a calibrated table may be anything ascending). Past the end levels the two
    nearest errors differ by a gap >= 2^-16 m s, their float32 rounding by <= 2^-23 (|x| + m s): no tie below
    |x| = 127 m s. (Twice the level, the bound before session 17, sent most lm2 tiles to the search: an RMS-scaled
    group of 64 reaches 3 RMS, 2 x lm2's 1.51, in 15% of groups.)"""
    sa = tl.abs(s)
    ok = (sa >= 7.888609052210118e-31) & (sa <= 1.2676506002282294e30)
    c0 = tl.load(cb_ptr)
    c1 = tl.load(cb_ptr + N - 1)
    m = tl.maximum(tl.abs(c0), tl.abs(c1))
    gap = tl.load(cb_ptr + 1) - c0
    for j in tl.static_range(2, N):
        gap = tl.minimum(gap, tl.load(cb_ptr + j) - tl.load(cb_ptr + j - 1))
    close = tl.where((gap >= m * 1.52587890625e-05) & (gap > 0), 0, 1)  # 2^-16; NaN or all-equal levels: close
    return ((~ok | ~(tl.abs(x) <= sa * m * 32.0)).to(tl.int32) + close) > 0


@triton.jit
def _e2m1_odd(x, s, cb_ptr):
    """1 where the e2m1 magnitude search (`_sorted_codes` over cb[0..7]) may differ from the full search: the group
    scale outside [2^-100, 2^100] (zero, NaN, inf, subnormal products), or |x| > 2 * 6 s (a scale saturated below
    the group's range)."""
    ok = (s >= 7.888609052210118e-31) & (s <= 1.2676506002282294e30)
    return ~ok | (tl.abs(x) > s * tl.load(cb_ptr + 7) * 2.0)


@triton.jit
def _plane(x_ptr, codes_ptr, r, g, h, grp, T, st, sh, sd, unit, gok, s_raw, s_val, m_raw, m_val, s_eff, cb_ptr, xrot,
           W: tl.constexpr, SH: tl.constexpr, PO: tl.constexpr, STRIDED: tl.constexpr,
           D: tl.constexpr, FMT: tl.constexpr, G: tl.constexpr, NG: tl.constexpr, GP: tl.constexpr,
           CHAN: tl.constexpr, SYM: tl.constexpr, RULE: tl.constexpr, RND: tl.constexpr, RECIP: tl.constexpr,
           OFF: tl.constexpr, QMAX: tl.constexpr, XORC: tl.constexpr, GB: tl.constexpr, HW: tl.constexpr,
           CBS: tl.constexpr, LUT: tl.constexpr, ROT: tl.constexpr, BLOCK_R: tl.constexpr):
    """Code, pack and store one bit plane (width W, code bits SH.., byte offset PO in the group).
    ROT: the plane's elements come from the rotated rows xrot [BLOCK_R, NG, G] (unpadded tiles)."""
    K: tl.constexpr = 8 // W
    NB: tl.constexpr = G // K
    NBP: tl.constexpr = GP // K
    jj = tl.arange(0, NBP)[None, None, :, None]
    kk = tl.arange(0, K)[None, None, None, :]
    if ROT > 0:
        if STRIDED:  # element k * NB + j of byte j
            x = tl.permute(tl.reshape(xrot, [BLOCK_R, NG, K, NB]), (0, 1, 3, 2))  # [BR, NG, NB, K]
        else:
            x = tl.reshape(xrot, [BLOCK_R, NG, NB, K])
    else:
        i = _elem_of(jj, kk, NB, K, STRIDED)
        xp, m = _x_ptrs(x_ptr, r[:, :, :, None], g[:, :, :, None], i, h, grp, T, st, sh, sd, G, NG, D, CHAN)
        x = as_f32(tl.load(xp, mask=m & (jj < NB), other=0.0))  # [BR, NGP, NBP, K]
    u = _codes(x, s_raw[:, :, :, None], s_val[:, :, :, None], m_raw[:, :, :, None], m_val[:, :, :, None],
               s_eff[:, :, :, None], cb_ptr, FMT, SYM, RULE, RND, RECIP, OFF, QMAX, XORC, HW, CBS, 0, LUT)
    byte = tl.sum(((u >> SH) & ((1 << W) - 1)) << (kk * W), axis=3)  # [BR, NGP, NBP]
    j3 = tl.arange(0, NBP)[None, None, :]
    tl.store(codes_ptr + unit * GB + PO + j3, byte.to(tl.uint8), mask=gok & (j3 < NB))


@triton.jit
def _ext16(xs, i):
    """Max of the sort keys (|x| bits << 16 | (G - 1 - i) << 1 | sign) of one [R, NB] tile of 16-bit
    floats: the largest magnitude, the first index on ties, NaN above everything."""
    b = xs.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    key = ((b & 0x7FFF) << 16) | ((0x7FFF - i) << 1) | (b >> 15)  # i < 2^15: bits 1..15
    return tl.max(key, axis=1)


@triton.jit
def _nanmax(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _nanmin(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _elem_of(j, k, NB: tl.constexpr, K: tl.constexpr, ST: tl.constexpr):
    """Element of a group held by sub-element k of byte j: GGML-strided k * NB + j, else sequential j * K + k."""
    if ST:
        i = k * NB + j
    else:
        i = j * K + k
    return i


@triton.jit
def _elems_of(j, NB: tl.constexpr, K: tl.constexpr, ST: tl.constexpr):
    """The elements of byte j held by its K sub-elements (`_elem_of`; element 0's repeated when K < 4)."""
    i0 = _elem_of(j, 0, NB, K, ST)
    i1, i2, i3 = i0, i0, i0
    if K >= 2:
        i1 = _elem_of(j, 1, NB, K, ST)
    if K == 4:
        i2 = _elem_of(j, 2, NB, K, ST)
        i3 = _elem_of(j, 3, NB, K, ST)
    return i0, i1, i2, i3


@triton.jit
def _tile(xr, k, j, lm, sd, NB: tl.constexpr, K: tl.constexpr, ST: tl.constexpr):
    """Elements k of every byte of the group rows: [R, NB]."""
    i = _elem_of(j, k, NB, K, ST)
    return tl.load(xr + i * sd, mask=lm, other=0.0), i


@triton.jit
def _tile_turned(base, k, lm, est, NB: tl.constexpr, K: tl.constexpr, ST: tl.constexpr):
    """`_tile` of rows whose [1, R] base pointers run along the last axis: loaded as [NB, R], turned to [R, NB]."""
    jj = tl.arange(0, NB)[:, None]
    return tl.trans(tl.load(base + _elem_of(jj, k, NB, K, ST).to(tl.int64) * est, mask=tl.trans(lm), other=0.0))


@triton.jit
def _pack_codes(f0, f1, f2, f3, sr, sv, mr, mv, se, cb_ptr, FMT: tl.constexpr, SYM: tl.constexpr, RULE: tl.constexpr,
                RND: tl.constexpr, RECIP: tl.constexpr, OFF: tl.constexpr, QMAX: tl.constexpr, XORC: tl.constexpr,
                HW: tl.constexpr, CBS: tl.constexpr, MODE: tl.constexpr, K: tl.constexpr, W: tl.constexpr,
                WH: tl.constexpr, LUT: tl.constexpr):
    """Codes of the K element tiles [R, NB] packed into the first plane's bytes (W bits a code) and, WH > 0, the
    second plane's bits of each byte position (the codes' bits from W on, WH a code; int32 [R, NB] both)."""
    M0: tl.constexpr = (1 << W) - 1
    u = _codes(f0, sr, sv, mr, mv, se, cb_ptr, FMT, SYM, RULE, RND, RECIP, OFF, QMAX, XORC, HW, CBS, MODE, LUT, WIDE_LUT)
    byte = u & M0 if WH > 0 else u
    hi = u >> W
    if K >= 2:
        u = _codes(f1, sr, sv, mr, mv, se, cb_ptr, FMT, SYM, RULE, RND, RECIP, OFF, QMAX, XORC, HW, CBS, MODE, LUT, WIDE_LUT)
        byte = byte | ((u & M0 if WH > 0 else u) << W)
        hi = hi | ((u >> W) << WH)
    if K == 4:
        u = _codes(f2, sr, sv, mr, mv, se, cb_ptr, FMT, SYM, RULE, RND, RECIP, OFF, QMAX, XORC, HW, CBS, MODE, LUT, WIDE_LUT)
        byte = byte | ((u & M0 if WH > 0 else u) << 4)
        hi = hi | ((u >> W) << (2 * WH))
        u = _codes(f3, sr, sv, mr, mv, se, cb_ptr, FMT, SYM, RULE, RND, RECIP, OFF, QMAX, XORC, HW, CBS, MODE, LUT, WIDE_LUT)
        byte = byte | ((u & M0 if WH > 0 else u) << 6)
        hi = hi | ((u >> W) << (3 * WH))
    return byte, hi


@triton.jit
def _pack_exact_tiles(xr, j, lm, est, sr, sv, mr, mv, se, cb_ptr, FMT: tl.constexpr, SYM: tl.constexpr,
                      RULE: tl.constexpr, RND: tl.constexpr, RECIP: tl.constexpr, OFF: tl.constexpr,
                      QMAX: tl.constexpr, XORC: tl.constexpr, HW: tl.constexpr, CBS: tl.constexpr, K: tl.constexpr,
                      NB: tl.constexpr, ST: tl.constexpr, W: tl.constexpr, WH: tl.constexpr, LUT: tl.constexpr):
    """`_pack_codes` by the exact path (MODE 2) one element tile at a time, each loaded again (element by element,
    unrotated inputs): the rare fallback then needs one tile's registers, not the K tiles' of the fast path."""
    M0: tl.constexpr = (1 << W) - 1
    byte = tl.zeros(lm.shape, tl.int32) + tl.zeros([1, NB], tl.int32)
    hi = byte
    for k in tl.range(0, K, loop_unroll_factor=1):
        xk, _ = _tile(xr, k, j, lm, est, NB, K, ST)
        u = _codes(as_f32(xk), sr, sv, mr, mv, se, cb_ptr, FMT, SYM, RULE, RND, RECIP, OFF, QMAX, XORC, HW, CBS, 2, LUT)
        byte = byte | ((u & M0 if WH > 0 else u) << (k * W))
        hi = hi | ((u >> W) << (k * WH))
    return byte, hi


@triton.jit
def _load_elems(x_ptr, xr, j, lm, est, c, pid, grp, T, st, sh, sd, h, R: tl.constexpr, NB: tl.constexpr,
                K: tl.constexpr, ST: tl.constexpr, G: tl.constexpr, NG: tl.constexpr, ROT: tl.constexpr,
                RC: tl.constexpr, CHAN: tl.constexpr, PK: tl.constexpr, BLOCK_R: tl.constexpr, D: tl.constexpr):
    """The K element tiles [R, NB] of `_store_rows`' group rows: as loaded (x0..x3, the input's dtype; rotated float32
    where ROT), as float32 (f0..f3), and the group element each holds (i0..i3, [1, NB]). Tile 0 repeated when K < 4."""
    if ROT > 0:  # whole token rows [BLOCK_R, D], rotated, then cut into [R, NB] element tiles
        tt = pid * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]
        cc = tl.arange(0, NG * G)[None, :]
        xt = as_f32(tl.load(x_ptr + tt.to(tl.int64) * st + h * sh + cc * sd, mask=tt < T, other=0.0))
        y = tl.reshape(_rotate_rows(xt, BLOCK_R, NG * G, ROT, RC), [R, G])
        f0, f1, f2, f3 = byte_tiles(y, R, NB, K, ST)
        i0, i1, i2, i3 = _elems_of(j, NB, K, ST)
        x0, x1, x2, x3 = f0, f1, f2, f3
    elif CHAN and CHAN_J:  # channel rows: each element tile loaded as [NB, R] (bytes x channels) and turned, the
        # channels' contiguity hidden (c ^ 0 for T >= 0) so the load is not vectorized along them: lanes and warps run
        # along channels and every thread holds its channels' G tokens (statistics and packing in registers)
        co = (c ^ (T >> 31))[None, :]  # [1, R], = c
        base = x_ptr + (grp * G).to(tl.int64) * st + (h * sh)[None, :] + co * sd  # h: each row's head
        x0 = _tile_turned(base, 0, lm, st, NB, K, ST)
        x1, x2, x3 = x0, x0, x0
        if K >= 2:
            x1 = _tile_turned(base, 1, lm, st, NB, K, ST)
        if K == 4:
            x2 = _tile_turned(base, 2, lm, st, NB, K, ST)
            x3 = _tile_turned(base, 3, lm, st, NB, K, ST)
        i0, i1, i2, i3 = _elems_of(j, NB, K, ST)
        f0, f1, f2, f3 = as_f32(x0), as_f32(x1), as_f32(x2), as_f32(x3)
    elif CHAN and CHAN_T:  # channel rows: the [G, BLOCK_R] token x channel tile loaded whole, turned in registers
        tg = tl.arange(0, G)[:, None]
        xg = tl.load(x_ptr + (grp * G + tg).to(tl.int64) * st + (h * sh + c * sd)[None, :], mask=tl.trans(lm),
                     other=0.0)  # [G, R]
        x0, x1, x2, x3 = byte_tiles(tl.trans(xg), R, NB, K, ST)
        i0, i1, i2, i3 = _elems_of(j, NB, K, ST)
        f0, f1, f2, f3 = as_f32(x0), as_f32(x1), as_f32(x2), as_f32(x3)
    elif PK:  # byte j's K elements in one word [R, NB] (little-endian: element k at bits 16 k)
        wt = tl.load(xr.to(tl.pointer_type(tl.int64 if K == 4 else tl.int32)) + j, mask=lm, other=0)
        XT: tl.constexpr = x_ptr.dtype.element_ty
        x0 = wt.to(tl.int16).to(XT, bitcast=True)
        x1 = (wt >> 16).to(tl.int16).to(XT, bitcast=True)
        x2, x3 = x0, x0
        i0 = _elem_of(j, 0, NB, K, ST)
        i1 = _elem_of(j, 1, NB, K, ST)
        i2, i3 = i0, i0
        if K == 4:
            x2 = (wt >> 32).to(tl.int16).to(XT, bitcast=True)
            x3 = (wt >> 48).to(tl.int16).to(XT, bitcast=True)
            i2 = _elem_of(j, 2, NB, K, ST)
            i3 = _elem_of(j, 3, NB, K, ST)
        f0, f1, f2, f3 = as_f32(x0), as_f32(x1), as_f32(x2), as_f32(x3)
    else:
        x0, i0 = _tile(xr, 0, j, lm, est, NB, K, ST)
        x1, i1 = x0, i0
        x2, i2 = x0, i0
        x3, i3 = x0, i0
        if K >= 2:
            x1, i1 = _tile(xr, 1, j, lm, est, NB, K, ST)
        if K == 4:
            x2, i2 = _tile(xr, 2, j, lm, est, NB, K, ST)
            x3, i3 = _tile(xr, 3, j, lm, est, NB, K, ST)
        f0, f1, f2, f3 = as_f32(x0), as_f32(x1), as_f32(x2), as_f32(x3)
    return x0, x1, x2, x3, f0, f1, f2, f3, i0, i1, i2, i3


@triton.jit
def _store_rows(x_ptr, codes_ptr, scales_ptr, zeros_ptr, slot_ptr, static_ptr, ts_ptr, cb_ptr, flag_ptr, prog, T, st,
                sh, sd, pid, h, grp, HK: tl.constexpr, P: tl.constexpr, D: tl.constexpr, CHAN: tl.constexpr, FMT: tl.constexpr,
                G: tl.constexpr, NG: tl.constexpr,
                STATIC: tl.constexpr, SYM: tl.constexpr, RULE: tl.constexpr, SDT: tl.constexpr,
                SDIV: tl.constexpr, ELEM_INT: tl.constexpr, HAS_TS: tl.constexpr, RND: tl.constexpr,
                RECIP: tl.constexpr, OFF: tl.constexpr, QMAX: tl.constexpr, XORC: tl.constexpr, W: tl.constexpr,
                ST: tl.constexpr, HW: tl.constexpr, CBS: tl.constexpr, ROT: tl.constexpr, RC: tl.constexpr,
                WH: tl.constexpr, PK: tl.constexpr, TWO: tl.constexpr, BLOCK_R: tl.constexpr, LUT: tl.constexpr,
                BOUND: tl.constexpr, SAFE: tl.constexpr):
    """Token rows, one bit plane (W = bits in {2, 4, 8}): the tile is R = BLOCK_R * NG group rows
    x NB bytes, read once as K = 8 / W tiles [R, NB] (element k of every byte), so the group
    statistics, the codes and the packed bytes all live in one layout and every load and store is
    a contiguous vector (strided GGML packing) or a K-strided one (sequential packing). ROT: the BLOCK_R token
    rows are loaded whole, rotated in registers and cut into the K element tiles. WH > 0: a second, sequentially
    packed bit plane of WH bits (int3 / lm3 = 2 + 1, int5 = 4 + 1, int6 = 4 + 2) from the same codes: its bytes
    hold the high bits of 8 / WH consecutive elements, i.e. of 8 / (WH * K) adjacent bytes of the first plane.
    CHAN (channel-axis groups, KIVI keys): the group rows are BLOCK_R channels of one G-token group (program grp),
    the elements of a row G consecutive tokens; everything after the loads is the same. PK (sequential packing of
    16-bit inputs with unit element stride, rows aligned): the K elements of a byte are K contiguous 16-bit values,
    loaded as one 2K-byte word and cut by shifts, so a warp's load is one contiguous run instead of K strided ones.
    TWO (the rare exact fallback, `run`): 0 inline (a tile with a rare element recomputes its codes exactly here);
    1 the main pass of two: fast codes only, flag_ptr[prog] = whether the tile has a rare element; 2 the fixup pass
    (entered only for flagged programs): the exact codes."""
    R: tl.constexpr = BLOCK_R * NG
    K: tl.constexpr = 8 // W
    NB: tl.constexpr = G // K
    q = tl.arange(0, R)  # [R] group rows: token q // NG, group q % NG (CHAN: channel)
    j = tl.arange(0, NB)[None, :]  # [1, NB]
    if CHAN:  # one slot for the group's G tokens (consecutive slots from a multiple of G)
        if CHAN_HEADS:  # rows run over (head, channel): one program's rows may span heads (the launch's dim 1 is 1)
            rr = pid * BLOCK_R + q
            hh = rr // D
            c = rr % D
            rok = rr < HK * D
        else:
            c = pid * BLOCK_R + q
            hh = c * 0 + h  # [R]
            rok = c < D
        slot = tl.load(slot_ptr + grp * G + q * 0).to(tl.int64)  # [R], one value
        live = rok & (slot >= 0)
        unit = ((slot // P * HK + hh) * (P // G) + (slot % P) // G) * D + c  # [R] group index in the pages
        xr = (x_ptr + (grp * G).to(tl.int64) * st + hh * sh + c * sd)[:, None]  # [R, 1]
        lm = rok[:, None]
        est = st  # element (token) stride
    else:
        t = pid * BLOCK_R + q // NG
        c = t  # (channel rows only)
        hh = h
        g = q % NG
        slot = tl.load(slot_ptr + t, mask=t < T, other=-1).to(tl.int64)
        live = (t < T) & (slot >= 0)
        unit = ((slot // P * HK + h) * P + slot % P) * NG + g  # [R] group index in the pages
        xr = (x_ptr + t.to(tl.int64) * st + h * sh + g * G * sd)[:, None]  # [R, 1]
        lm = (t < T)[:, None]
        est = sd
    X16: tl.constexpr = x_ptr.dtype.element_ty.primitive_bitwidth == 16 and ROT == 0
    x0, x1, x2, x3, f0, f1, f2, f3, i0, i1, i2, i3 = _load_elems(x_ptr, xr, j, lm, est, c, pid, grp, T, st, sh, sd, hh,
                                                                 R, NB, K, ST, G, NG, ROT, RC, CHAN, PK, BLOCK_R, D)
    one = tl.full([R], 1.0, tl.float32)
    s_raw = one
    m_raw = one * 0.0
    if STATIC:
        s_raw = one * tl.load(static_ptr)
    elif RULE != 2:
        if RULE == 3:  # rms (Lloyd-Max): sqrt(mean x^2) summed in float64 and rounded once, as the oracle
            d = f0.to(tl.float64)
            sq = d * d
            if K >= 2:
                d = f1.to(tl.float64)
                sq = sq + d * d
            if K == 4:
                d = f2.to(tl.float64)
                sq = sq + d * d
                d = f3.to(tl.float64)
                sq = sq + d * d
            stat = tl.sqrt(tl.sum(sq, axis=1) / G).to(tl.float32)  # NaN with a NaN element, inf with an inf
            bad = ~(stat < float("inf"))
        elif SYM and RULE == 1 and X16:  # GGML's signed extreme from one max over sort keys
            key = tl.maximum(tl.maximum(_ext16(x0, i0), _ext16(x1, i1)),
                             tl.maximum(_ext16(x2, i2), _ext16(x3, i3)))
            b16 = ((key >> 16) | ((key & 1) << 15)).to(tl.int16)
            stat = as_f32(b16.to(x_ptr.dtype.element_ty, bitcast=True))
        elif SYM and RULE == 1:  # float32 input: largest magnitude, first index on ties, its sign
            a = _nanmax(_nanmax(tl.abs(f0), tl.abs(f1)), _nanmax(tl.abs(f2), tl.abs(f3)))
            amax = tl.reduce(a, 1, _nanmax)[:, None]
            first = tl.minimum(tl.minimum(_first_at(tl.abs(f0) == amax, i0, G, 1), _first_at(tl.abs(f1) == amax, i1, G, 1)),
                               tl.minimum(_first_at(tl.abs(f2) == amax, i2, G, 1), _first_at(tl.abs(f3) == amax, i3, G, 1)))
            neg = tl.maximum(tl.maximum(_neg_at(f0, i0, first, 1), _neg_at(f1, i1, first, 1)),
                             tl.maximum(_neg_at(f2, i2, first, 1), _neg_at(f3, i3, first, 1)))
            stat = tl.where(neg > 0, _negated(amax), amax).reshape([R])
        elif SYM:
            a = _nanmax(_nanmax(tl.abs(f0), tl.abs(f1)), _nanmax(tl.abs(f2), tl.abs(f3)))
            stat = tl.reduce(a, 1, _nanmax)
        else:
            mx = tl.reduce(_nanmax(_nanmax(f0, f1), _nanmax(f2, f3)), 1, _nanmax)
            mn = tl.reduce(_nanmin(_nanmin(f0, f1), _nanmin(f2, f3)), 1, _nanmin)
            mx = tl.where(mx != mx, float("nan"), mx)  # canonical NaN, as the oracle
            mn = tl.where(mn != mn, float("nan"), mn)
            if tl.max(((mx == 0) | (mn == 0)).to(tl.int32)) > 0:  # rare: a zero extreme is the first zero (GGML)
                fz = tl.minimum(tl.minimum(_first_at(f0 == 0, i0, G, 1), _first_at(f1 == 0, i1, G, 1)),
                                tl.minimum(_first_at(f2 == 0, i2, G, 1), _first_at(f3 == 0, i3, G, 1)))
                negz = tl.maximum(tl.maximum(_neg_at(f0, i0, fz, 1), _neg_at(f1, i1, fz, 1)),
                                  tl.maximum(_neg_at(f2, i2, fz, 1), _neg_at(f3, i3, fz, 1)))
                zero = _zero_signed(negz.reshape([R]), mx)
                mx = tl.where(mx == 0, zero, mx)
                mn = tl.where(mn == 0, zero, mn)
            bad = ~((tl.abs(mx) < float("inf")) & (tl.abs(mn) < float("inf")))  # NaN-propagating extremes
            stat = mx - mn
            m_raw = mn
        if SYM and RULE != 3:  # the NaN-propagating |x| max (or signed extreme) is non-finite iff an element is
            bad = ~(tl.abs(stat) < float("inf"))
        # a non-finite element makes the group's scale (and zero) NaN, as the oracle does (no per-element work)
        s_raw, m_raw = _raw_scale(stat, m_raw, bad, ts_ptr, SDIV, HAS_TS)
    s_val, m_val, s_eff = _scales_out(s_raw, m_raw, scales_ptr, zeros_ptr, ts_ptr, unit, live, SYM, STATIC, RULE, SDT,
                                      ELEM_INT, HAS_TS)
    sr, sv, mr, mv, se = s_raw[:, None], s_val[:, None], m_raw[:, None], m_val[:, None], s_eff[:, None]
    GB: tl.constexpr = G * (W + WH) // 8  # bytes of a group, every plane
    # the fast codes of every element tile, and one block-wide check of their rare exact fallback for all of them (a
    # check per tile is a reduction and a barrier each: K of them a program)
    QSAFE: tl.constexpr = SAFE == 1  # (`quotient_safe`)
    CBSAFE: tl.constexpr = SAFE == 2  # (`codebook_safe`)
    HAS_ODD: tl.constexpr = RARE_PATHS and ((FMT == 0 and not RECIP and not QSAFE) or (FMT == 3 and CBS >= 1
                                                                                       and not CBSAFE))
    if HAS_ODD and TWO == 2:  # the fixup pass of a flagged program: every tile by the exact path
        byte, hi = _pack_codes(f0, f1, f2, f3, sr, sv, mr, mv, se, cb_ptr, FMT, SYM, RULE, RND, RECIP, OFF, QMAX,
                               XORC, HW, CBS, 2, K, W, WH, LUT)
    else:
        byte, hi = _pack_codes(f0, f1, f2, f3, sr, sv, mr, mv, se, cb_ptr, FMT, SYM, RULE, RND, RECIP, OFF, QMAX,
                               XORC, HW, CBS, 3 if CBSAFE else (1 if HAS_ODD or QSAFE else 0), K, W, WH, LUT)
    if HAS_ODD and TWO != 2:
        odd = _odd(f0, sr, sv, mr, mv, se, cb_ptr, FMT, SYM, RECIP, OFF, CBS, BOUND)
        if K >= 2 and not BOUND:
            odd = odd | _odd(f1, sr, sv, mr, mv, se, cb_ptr, FMT, SYM, RECIP, OFF, CBS)
        if K == 4 and not BOUND:
            odd = odd | _odd(f2, sr, sv, mr, mv, se, cb_ptr, FMT, SYM, RECIP, OFF, CBS)
            odd = odd | _odd(f3, sr, sv, mr, mv, se, cb_ptr, FMT, SYM, RECIP, OFF, CBS)
        odd = tl.where(live[:, None], odd, 0)  # rows past T or skipped (their zero scales would count as odd)
        if TWO == 1:  # the main pass: the fixup pass recomputes a flagged program (its codes here are overwritten)
            tl.store(flag_ptr + prog, tl.max(odd))
        elif tl.max(odd) > 0:  # rare: every tile of the program by the exact path
            if RARE_RELOAD == 2 and ROT == 0:  # its inputs loaded again a tile at a time
                byte, hi = _pack_exact_tiles(xr, j, lm, est, sr, sv, mr, mv, se, cb_ptr, FMT, SYM, RULE, RND, RECIP, OFF,
                                             QMAX, XORC, HW, CBS, K, NB, ST, W, WH, LUT)
            else:
                if RARE_RELOAD == 1 and ROT == 0:  # its inputs loaded again, all tiles
                    _, _, _, _, f0, f1, f2, f3, _, _, _, _ = _load_elems(x_ptr, xr, j, lm, est, c, pid, grp, T, st, sh,
                                                                         sd, hh, R, NB, K, ST, G, NG, ROT, RC, CHAN, PK,
                                                                         BLOCK_R, D)
                byte, hi = _pack_codes(f0, f1, f2, f3, sr, sv, mr, mv, se, cb_ptr, FMT, SYM, RULE, RND, RECIP, OFF,
                                       QMAX, XORC, HW, CBS, 2, K, W, WH, LUT)
    tl.store(codes_ptr + unit[:, None] * GB + j, byte.to(tl.uint8), mask=live[:, None])
    if WH > 0:  # the second plane: M = 8 / (WH * K) adjacent first-plane bytes make one byte
        M: tl.constexpr = 8 // (WH * K)
        NB1: tl.constexpr = NB // M
        S: tl.constexpr = K * WH  # bits one first-plane byte contributes
        if M == 2:
            b0, b1 = tl.split(tl.reshape(hi, [R, NB1, 2]))
            hb = b0 | (b1 << S)
        else:  # M == 4: byte j of the plane takes first-plane bytes 4j .. 4j + 3
            e, o = tl.split(tl.reshape(hi, [R, NB1, 2, 2]))  # even / odd first-plane bytes: [R, NB1, 2]
            p0, p2 = tl.split(e)
            p1, p3 = tl.split(o)
            hb = p0 | (p1 << S) | (p2 << (2 * S)) | (p3 << (3 * S))
        j1 = tl.arange(0, NB1)[None, :]
        tl.store(codes_ptr + unit[:, None] * GB + NB + j1, hb.to(tl.uint8), mask=live[:, None])


@triton.jit
def _store_kernel(x_ptr, codes_ptr, scales_ptr, zeros_ptr, slot_ptr, static_ptr, ts_ptr, cb_ptr, flag_ptr,
                  T, st, sh, sd, TB,
                  HK: tl.constexpr, D: tl.constexpr, P: tl.constexpr, FMT: tl.constexpr, BITS: tl.constexpr,
                  G: tl.constexpr, NG: tl.constexpr, GP: tl.constexpr, NGP: tl.constexpr, CHAN: tl.constexpr,
                  STATIC: tl.constexpr, SYM: tl.constexpr, RULE: tl.constexpr, RND: tl.constexpr,
                  RECIP: tl.constexpr, SDT: tl.constexpr, SDIV: tl.constexpr, ELEM_INT: tl.constexpr,
                  HAS_TS: tl.constexpr, OFF: tl.constexpr, QMAX: tl.constexpr, XORC: tl.constexpr,
                  W0: tl.constexpr, SH0: tl.constexpr, ST0: tl.constexpr, W1: tl.constexpr, SH1: tl.constexpr,
                  ST1: tl.constexpr, W2: tl.constexpr, SH2: tl.constexpr, ST2: tl.constexpr, FLAT: tl.constexpr,
                  HW: tl.constexpr, CBS: tl.constexpr, ROT: tl.constexpr, RC: tl.constexpr, PK: tl.constexpr,
                  TWO: tl.constexpr, BLOCK_R: tl.constexpr, LUT: tl.constexpr = 0, BOUND: tl.constexpr = False,
                  SAFE: tl.constexpr = 0):
    pid = tl.program_id(0)
    h = tl.program_id(1)
    grp = tl.program_id(2)
    if FLAT:  # token rows, one bit plane: the group-row tile
        prog = (pid * tl.num_programs(1) + h) * tl.num_programs(2) + grp
        if TWO != 2 or tl.load(flag_ptr + prog) != 0:  # the fixup pass: flagged programs only
            _store_rows(x_ptr, codes_ptr, scales_ptr, zeros_ptr, slot_ptr, static_ptr, ts_ptr, cb_ptr, flag_ptr, prog,
                        T, st, sh, sd, pid, h, grp, HK, P, D, CHAN, FMT, G, NG, STATIC, SYM, RULE, SDT, SDIV, ELEM_INT,
                        HAS_TS, RND, RECIP, OFF, QMAX, XORC, W0, ST0, HW, CBS, ROT, RC, W1, PK, TWO, BLOCK_R, LUT, BOUND,
                        SAFE)
        return
    r = pid * BLOCK_R + tl.arange(0, BLOCK_R)[:, None, None]  # [BR, 1, 1]
    g = tl.arange(0, NGP)[None, :, None]  # [1, NGP, 1]
    if CHAN:  # one slot per channel group: the page block of G tokens
        slot = tl.load(slot_ptr + grp * G).to(tl.int64)
        live = (r < D) & ((r * 0 + slot) >= 0)  # broadcast first: triton 3.9's interpreter rejects scalar & tensor masks
        unit = ((slot // P * HK + h) * (P // G) + (slot % P) // G) * D + r  # [BR, 1, 1] group index
    else:
        slot = tl.load(slot_ptr + r, mask=r < T, other=-1).to(tl.int64)  # [BR, 1, 1]
        live = (r < T) & (slot >= 0)
        unit = ((slot // P * HK + h) * P + slot % P) * NG + g  # [BR, NGP, 1] group index
    gok = live & (g < NG)
    if FMT >= 4:  # bf16 / fp16 storage: a rounded copy (G = D, NG = 1)
        i = tl.arange(0, GP)[None, None, :]
        xp, m = _x_ptrs(x_ptr, r, g, i, h, grp, T, st, sh, sd, G, NG, D, CHAN)
        x = as_f32(tl.load(xp, mask=m, other=0.0))
        if FMT == 4:
            _, c = bf16_round(x)
        else:
            _, c = narrow_float(x, 10, -14, 15, 16, 0x7E00)
        tl.store(codes_ptr + unit * D + i, c.to(tl.int16), mask=gok & m)
    else:
        ones = tl.full([BLOCK_R, NGP, 1], 1.0, tl.float32)
        s_raw = ones
        m_raw = ones * 0.0
        xrot = ones
        if ROT > 0:  # whole token rows, rotated once in registers: [BR, NG, G] (unpadded: NGP = NG, GP = G)
            cc = tl.arange(0, D)[None, :]
            rr = r.reshape([BLOCK_R, 1])
            xt = as_f32(tl.load(x_ptr + rr.to(tl.int64) * st + h * sh + cc * sd, mask=rr < T, other=0.0))
            xrot = tl.reshape(_rotate_rows(xt, BLOCK_R, D, ROT, RC), [BLOCK_R, NG, G])
        if STATIC:  # axis tensor: one calibrated scale for the layer
            s_raw = ones * tl.load(static_ptr)
        elif RULE != 2:
            i = tl.arange(0, GP)[None, None, :]
            if ROT > 0:
                x0 = xrot
                m = (r < T) & (i < G)
            else:
                xp, m = _x_ptrs(x_ptr, r, g, i, h, grp, T, st, sh, sd, G, NG, D, CHAN)
                x0 = as_f32(tl.load(xp, mask=m, other=0.0))  # [BR, NGP, GP]
            s_raw, m_raw = _group_stats(x0, m, i, SYM, RULE, SDIV, GP)
            if HAS_TS:  # NVFP4: group scales live under the fp32 tensor scale
                s_raw = tl.math.div_rn(s_raw, ones * tl.load(ts_ptr))
        s_val, m_val, s_eff = _scales_out(s_raw, m_raw, scales_ptr, zeros_ptr, ts_ptr, unit, gok, SYM, STATIC, RULE,
                                          SDT, ELEM_INT, HAS_TS)
        _plane(x_ptr, codes_ptr, r, g, h, grp, T, st, sh, sd, unit, gok, s_raw, s_val, m_raw, m_val, s_eff, cb_ptr,
               xrot, W0, SH0, 0, ST0, D, FMT, G, NG, GP, CHAN, SYM, RULE, RND, RECIP, OFF, QMAX, XORC, G * BITS // 8, HW,
               CBS, LUT, ROT, BLOCK_R)
        if W1 > 0:
            _plane(x_ptr, codes_ptr, r, g, h, grp, T, st, sh, sd, unit, gok, s_raw, s_val, m_raw, m_val, s_eff,
                   cb_ptr, xrot, W1, SH1, G * W0 // 8, ST1, D, FMT, G, NG, GP, CHAN, SYM, RULE, RND, RECIP, OFF, QMAX,
                   XORC, G * BITS // 8, HW, CBS, LUT, ROT, BLOCK_R)
        if W2 > 0:
            _plane(x_ptr, codes_ptr, r, g, h, grp, T, st, sh, sd, unit, gok, s_raw, s_val, m_raw, m_val, s_eff,
                   cb_ptr, xrot, W2, SH2, G * (W0 + W1) // 8, ST2, D, FMT, G, NG, GP, CHAN, SYM, RULE, RND, RECIP, OFF,
                   QMAX, XORC, G * BITS // 8, HW, CBS, LUT, ROT, BLOCK_R)


# ---- host side -----------------------------------------------------------------------------------
@functools.lru_cache(maxsize=256)
def kernel_params(spec, D: int, flat: bool = True) -> dict:
    """The constexprs that carry `spec` (rule != mse) for head_dim D. A rotated spec must be one the kernel
    rotates itself (`fuses_rotation`; the others are passed rotated, as their spec without rotation).
    `flat=False` keeps single-plane token-row specs on the general [rows, groups, elements] path."""
    if spec.is_float_storage:
        return dict(FMT=FMT_IDS[spec.fmt], BITS=16, G=D, NG=1, GP=next_pow2(D), NGP=1, CHAN=False, STATIC=False,
                    SYM=True, RULE=2, RND=0, RECIP=False, SDT=2, SDIV=1.0, ELEM_INT=False, HAS_TS=False, OFF=0,
                    QMAX=0, XORC=0, W0=8, SH0=0, ST0=False, W1=0, SH1=0, ST1=False, W2=0, SH2=0, ST2=False,
                    FLAT=False, CBS=0, LUT=0, BOUND=False, SAFE=0, ROT=0, RC=1.0)
    if spec.rotation != "none" and not fuses_rotation(spec, D):
        raise ValueError(f"the store kernel does not rotate {spec} at head_dim {D}; pass x rotated "
                         "(kvlab.cache.paging.prerotate) with the spec's rotation none")
    fmt, b = spec.fmt, spec.bits
    G = spec.group_size(D)
    NG = 1 if spec.axis == "chan" else D // G
    if fmt == "int":
        sdiv = ({"signed": -(2 ** (b - 1)), "full": 2 ** (b - 1)}.get(spec.rule, 2 ** (b - 1) - 1) if spec.sym
                else 2 ** b - 1)
    elif fmt in FP8_MAX:
        sdiv = 2 ** ELEM_EMAX[fmt] if spec.scale_dtype == "e8m0" else FP8_MAX[fmt]
    elif spec.rule == "signed":
        sdiv = min(CODEBOOKS[fmt])
    elif spec.rule == "rms":  # Lloyd-Max levels are in RMS units
        sdiv = 1.0
    else:
        sdiv = 2 ** ELEM_EMAX.get(fmt, 0) if spec.scale_dtype == "e8m0" else codebook_absmax(fmt)
    planes = [(w, sh, spec.pack == "ggml" and w in (2, 4)) for sh, w in plane_order(spec)] + [(0, 0, False)] * 2
    sym_int = fmt == "int" and spec.sym
    p = dict(FMT=FMT_IDS[fmt], BITS=b, G=G, NG=NG, GP=next_pow2(G), NGP=next_pow2(NG), CHAN=spec.axis == "chan",
             STATIC=spec.static_scale, SYM=spec.sym, RULE=RULE_IDS[spec.rule],
             RND=RND_IDS[spec.rounding], RECIP=spec.recip, SDT=SDT_IDS[spec.scale_dtype], SDIV=float(sdiv),
             ELEM_INT=fmt == "int", HAS_TS=spec.tensor_scale, OFF=2 ** (b - 1) if sym_int else 0,
             QMAX=2 ** b - 1, XORC=(1 << (b - 1)) if sym_int and (b == 8 or spec.twos) else 0,
             CBS=2 ** b if fmt == "int" and spec.calibrated else _search_mode(fmt, spec.rule), ROT=0, RC=1.0)
    p["LUT"] = lut_mode(spec) if p["FMT"] == 3 and p["CBS"] >= 1 and not spec.calibrated else 0
    # the sorted brackets' rare check per group only: with a scale from the group's own statistics, |x| / |s| is at
    # most the largest level (absmax, signed: up to the scale's rounding to f16 / bf16), 2^(emax + 1) for e8m0
    # (e2m1: 8 < 12), sqrt(G) for rms (|x_i|^2 <= sum x^2 = G rms^2: 11.3 at G 128, against 32 x lm2's 1.51), the
    # int's range for a calibrated int (|x - zero| <= 2^b - 1 steps, its end levels kept); an f16 scale that
    # overflows is inf, a flushed e8m0 one below 2^-100: both the per-group check's. Not for a static or unit scale
    # (x may lie anywhere), nor e4m3 scales or a tensor scale (e4m3 saturates at 448 below a group's range)
    p["BOUND"] = bool(BOUND_CHECK and p["CBS"] >= 1 and p["FMT"] in (0, 3) and not spec.static_scale
                      and spec.rule != "unit" and (p["FMT"] == 3 or spec.calibrated) and not spec.tensor_scale
                      and spec.scale_dtype in ("f16", "bf16", "f32", "e8m0"))
    p["SAFE"] = _safe_mode(p)
    if spec.rotation == "had":  # the oracle's transform over the whole row, in registers
        p.update(ROT=D.bit_length() - 1, RC=norm_constant(D))
    for k, (w, sh, st) in enumerate(planes[:3]):
        p.update({f"W{k}": w, f"SH{k}": sh, f"ST{k}": st})
    # one plane holding whole codes, token rows: the group-row path (`_store_rows`): int codes (GGML's reciprocal,
    # or IEEE division done as a multiply with a rare exact fallback) and codebooks; fp8 keeps the general tile
    # (the timings and offline counts: benchmarks/NOTES_store.md)
    no_div = fmt == "int" or p["FMT"] == 3
    one_plane = p["W1"] == 0 and p["W0"] == b and b in (2, 4, 8)
    # two sequentially packed planes (3 = 2 + 1, 5 = 4 + 1, 6 = 4 + 2 bits): the second from the same codes
    two_planes = (p["W2"] == 0 and p["W1"] > 0 and spec.pack != "ggml" and p["W0"] in (2, 4)
                  and (8 // p["W1"]) % (8 // p["W0"]) == 0 and G * p["W1"] >= 8)
    # channel-axis groups (KIVI keys): the same tile with channels as its group rows (one plane, no rotation)
    chan_ok = spec.axis != "chan" or (one_plane and spec.rotation == "none")
    p["FLAT"] = (flat and no_div and chan_ok and (one_plane or two_planes)
                 and G == next_pow2(G) and NG == next_pow2(NG))  # unpadded tiles: power-of-two group sizes and counts
    return p


def packed_loads(x: torch.Tensor, p: dict) -> bool:
    """The group-row path's word loads (constexpr PK): sequentially packed token rows of 2 or 4 codes a byte, a 16-bit
    x with unit element stride whose rows, heads and base are aligned to a word of K elements."""
    K = 8 // p["W0"]
    return bool(PACKED_LOADS and p["FLAT"] and not p["CHAN"] and not p["ROT"] and not p["ST0"] and K in (2, 4)
                and x.element_size() == 2 and x.stride(2) == 1 and x.stride(0) % K == 0 and x.stride(1) % K == 0
                and x.data_ptr() % (2 * K) == 0)


def _search_mode(fmt: str, rule: str) -> int:
    """The store's CBS constexpr: 1 for fp4 e2m1 in GGML order (a search over its 8 ascending magnitudes; the whole
    order is not ascending), the number of levels of an ascending codebook of 4, 8 or 16 levels (nf4, iq4nl, Lloyd-Max), 0 (the full search)
    otherwise."""
    if fmt == "fp4_e2m1":
        return 1 if rule != "rms" else 0
    cb = CODEBOOKS.get(fmt)
    if cb is None:
        return 0
    n = len(cb)
    return n if n in (4, 8, 16) and all(a < b for a, b in zip(cb, cb[1:])) else 0


def _prune(configs, named_args, **kw):
    a = {**named_args, **kw}
    rows = (a["D"] * (a["HK"] if CHAN_HEADS and a["FLAT"] else 1)) if a["CHAN"] else 1 << 30
    tile = a["GP"] * a["NGP"]
    keep = [c for c in configs if c.kwargs["BLOCK_R"] <= max(4, next_pow2(rows)) and c.kwargs["BLOCK_R"] * tile <= 8192]
    return keep or configs[:1]


_AUTOTUNED = None
_CODEBOOKS: dict = {}
_DUMMY: dict = {}


def _graph_bench(fn, quantiles=None):
    """The autotuner's timer: each config's launch replayed from a CUDA graph. A 30-50 us write timed
    eagerly measures the Python launch path as much as the kernel, and its pick was a coin toss."""
    import triton.testing
    return triton.testing.do_bench_cudagraph(fn, rep=10, quantiles=quantiles)


def _autotuned():
    global _AUTOTUNED
    if _AUTOTUNED is None:
        cands = [triton.Config({"BLOCK_R": c.block_r}, num_warps=c.num_warps, maxnreg=c.maxnreg) for c in CANDIDATES]
        _AUTOTUNED = triton.autotune(cands, key=AUTOTUNE_KEY, prune_configs_by={"early_config_prune": _prune},
                                     do_bench=_graph_bench)(_store_kernel)
    return _AUTOTUNED


def _levels(fmt: str) -> tuple[float, ...]:
    """The ascending levels the store brackets for a fixed codebook format (fp4 e2m1: its 8 magnitudes), as float32
    values; () for the others."""
    if fmt not in CODEBOOKS:
        return ()
    cb = torch.tensor(codebook16(fmt), dtype=torch.float32).tolist()
    n = 8 if fmt == "fp4_e2m1" else len(CODEBOOKS[fmt])
    return tuple(cb[:n])


def lut_bins(fmt: str) -> int:
    """The bin count of `fmt`'s bracket table (constexpr LUT; 0: the store bisects). Only where it measured faster:
    16-level codebooks and e2m1's magnitudes; lm2 / lm3 (a bisection of 2 or 3 steps) stay slower through three
    gathers (H200, 32K-token write, of copy, bisection -> table at 16x4: nf4 0.195 -> 0.276 (32x4 0.303), iq4nl
    0.200 -> 0.262 (0.332), lm4 0.069 -> 0.085, mxfp4 0.305 -> 0.360 (32x4), nvfp4 0.288 -> 0.343, lm2 0.151 ->
    0.119, lm3 0.121 -> 0.111: sweeps/results/h200/runs/s20-5f6978e/store_variants.txt).
    With the bin read by one 16-byte load (`WIDE_LUT`), lm3's 8 levels by the table ran 48.8 -> 41.2 instructions an
    element offline (group-row 32x4) and 41.6 -> 35.9 in the row walk its preset takes, but no faster on an H100
    (row walk 0.327 -> 0.317 of copy, sweeps/results/h100/runs/s30b-store-725cea5/store_lm3.txt): lm3 bisects."""
    lv = _levels(fmt)
    n = len(lv)
    return bins_for(lv) if BRACKET_LUT and (n == 16 or fmt == "fp4_e2m1") else 0


def lut_mode(spec) -> int:
    """The store's constexpr LUT for a fixed-codebook spec: -1 for e2m1 under a power-of-two scale (`E2M1_POW2`),
    else `lut_bins` (0: the bisection)."""
    if E2M1_POW2 and spec.fmt == "fp4_e2m1" and spec.scale_dtype == "e8m0" and not spec.tensor_scale:
        return -1
    if E2M1_ARITH and spec.fmt == "fp4_e2m1":
        return -2
    return lut_bins(spec.fmt)


def _codebook(fmt: str, device) -> torch.Tensor:
    """float32 [16 (+ 5 K)]: the format's 16 codebook entries, then its bracket table's K int32 bins and the same bins
    as K 16-byte entries (`tiles.bracket.wide_table`)."""
    key = (fmt, str(device), lut_bins(fmt))
    if key not in _CODEBOOKS:
        t = torch.tensor(codebook16(fmt) if fmt in CODEBOOKS else (0.0,) * 16, dtype=torch.float32)
        if key[2]:  # the K int32 bins, then the same bins as 16-byte (index, level, next level, 0) entries
            table = bracket_table(_levels(fmt))
            lut = torch.tensor(table, dtype=torch.int32).view(torch.float32)
            wide = torch.zeros(len(table), 4, dtype=torch.float32)
            wide[:, 1:3] = torch.tensor([e[1:] for e in wide_table(_levels(fmt), table)], dtype=torch.float32)
            wide[:, 0] = torch.tensor(table, dtype=torch.int32).view(torch.float32)
            t = torch.cat([t, lut, wide.reshape(-1)])
        _CODEBOOKS[key] = t.to(device)
    return _CODEBOOKS[key]


@functools.lru_cache(maxsize=16)
def _hw_fp8(device) -> bool:
    """GPU fp8 conversions (cvt.rn.satfinite from fp32) on sm_90+; elsewhere (the interpreter, older GPUs,
    where Triton converts through fp16 and rounds twice) the integer emulation."""
    return (not interpreting()) and torch.device(device).type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)


def kernel_pages(pages: dict, device) -> tuple:
    """(codes, scales, zeros, dummy) as the store kernels take them: the page tensors in their storage views (a spec
    without scales or zeros passes the codes in their place) and a float32 [1] stand-in for absent scalar operands."""
    codes = _storage_view(pages["codes"], None)
    dummy = _DUMMY.get(device)
    if dummy is None:
        dummy = _DUMMY[device] = torch.ones(1, dtype=torch.float32, device=device)
    return codes, _storage_view(pages.get("scales"), codes), _storage_view(pages.get("zeros"), codes), dummy


def _storage_view(t: torch.Tensor | None, fallback: torch.Tensor) -> torch.Tensor:
    """Pages as the kernel stores them: 16-bit floats as int16 bits, fp8 as uint8 bytes."""
    if t is None:
        return fallback
    if t.dtype in (torch.float16, torch.bfloat16):
        return t.view(torch.int16)
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8)
    return t


def why_not(spec) -> str | None:
    """None when the kernel stores `spec`; else why (the api then runs the reference)."""
    if spec.rule == "mse":
        return "rule=mse searches 21 clipping ratios per group; the store uses the torch reference for it"
    if spec.outliers:
        return "outlier slots (out=N) pick each token's largest values first; the store uses the torch reference for it"
    return None


def run(x: torch.Tensor, pages: dict, slot_mapping: torch.Tensor, spec, page_size: int, *,
        scale: torch.Tensor | None = None, tensor_scale: torch.Tensor | None = None,
        config: StoreConfig | None = None, flat: bool = True) -> StoreConfig | None:
    """Launch the store kernel. Inputs are already checked by `kvlab.kernels.store.store`:
    x [T, Hk, D] float32/16/bf16 (rotated when the spec rotates; `spec` then has rotation none),
    pages of `PageLayout(spec, D, page_size, Hk)`, slot_mapping [T] int32/int64 (-1: skip),
    scale / tensor_scale float32 [1] on x's device when the spec needs them.
    config: a fixed StoreConfig (`api.store` passes the tuned entry or `default_config`); None: Triton's autotuner
    picks one on the GPU (returned, for the tuned store), a fixed small tile under the interpreter. flat=False forces
    the general tile path."""
    T, Hk, D = x.shape
    if T == 0:
        return None
    p = kernel_params(spec, D, flat)
    codes, scales, zeros, dummy = kernel_pages(pages, x.device)
    static = scale if scale is not None else dummy
    ts = tensor_scale if tensor_scale is not None else dummy
    slots = slot_mapping.contiguous()
    n_rows, n_grp = (D, T // p["G"]) if p["CHAN"] else (T, 1)
    n_heads = Hk
    if p["CHAN"] and p["FLAT"] and CHAN_HEADS:  # rows over (head, channel): the launch's head dimension folds in
        n_rows, n_heads = Hk * D, 1  # (each row's address is its own head's: any strides)
    lut = pages["codebook"] if spec.calibrated else _codebook(spec.fmt, x.device)  # calibrated: the layer's levels
    two = TWO_PASS and T >= TWO_PASS_MIN_TOKENS and two_pass(p)
    if config is None and interpreting():
        config = StoreConfig(block_r=min(16, max(4, next_pow2(n_rows))), num_warps=4)
    # one int32 flag per program of the main pass (every program writes its own): for the config's tile, or the
    # smallest candidate's when the autotuner picks
    min_r = config.block_r if config is not None else min(c.block_r for c in CANDIDATES)
    flags = torch.empty(triton.cdiv(n_rows, min_r) * n_heads * n_grp, dtype=torch.int32, device=x.device) if two else dummy
    # TB: the token count's bucket, in the autotuner's key (a first write of a few tokens must not pick the tiles of
    # every later prefill: a 517-token write's pick ran a 32K-token int2 write at 0.35 of copy against 0.45)
    tb = t_bucket(T)
    args = (x, codes, scales, zeros, slots, static, ts, lut, flags, T, *x.stride(),
            len(T_BUCKETS) if tb == "max" else T_BUCKETS.index(int(tb)))
    const = dict(HK=Hk, D=D, P=page_size, HW=_hw_fp8(x.device), PK=packed_loads(x, p), **p)
    tuned = None
    if config is None:  # the autotuner times and runs the main pass
        tuner = _autotuned()
        tuner[lambda meta: (triton.cdiv(n_rows, meta["BLOCK_R"]), n_heads, n_grp)](*args, **const, TWO=int(two),
                                                                              enable_fp_fusion=False)
        best = tuner.best_config
        config = tuned = StoreConfig(block_r=best.kwargs["BLOCK_R"], num_warps=best.num_warps,
                                     maxnreg=getattr(best, "maxnreg", None))
        modes = (2,) if two else ()
    else:
        modes = (1, 2) if two else (0,)
    extra = {} if interpreting() or config.maxnreg is None else {"maxnreg": config.maxnreg}
    for mode in modes:  # the main pass (unless tuned), then the fixup pass with the same tiles
        _store_kernel[(triton.cdiv(n_rows, config.block_r), n_heads, n_grp)](
            *args, **const, TWO=mode, BLOCK_R=config.block_r, num_warps=config.num_warps, enable_fp_fusion=False,
            **extra)
    return tuned


@functools.lru_cache(maxsize=1024)
def default_config(spec, D: int, Hk: int) -> StoreConfig:
    """The store's config where no tuned entry matches (another head count, head_dim, token bucket or GPU), by family:
    the tiles the autotuner and `store_variants.py` found fastest on the H200 for a 32K-token write at Hk 8, D 128
    (sweeps/results/h200/store.csv's config column, runs/s23b-5b4d313): 64 channel rows on one warp for channel-axis
    keys on the group-row path (kivi4 / kivi2), 16-row tiles for rotated specs (two warps; four for codebook and fp4
    elements), 8 rows for 16-bit storage, 32 rows on four warps for every other family; where the autotuner's own
    bound (`_prune`) drops that tile, the largest of `candidates` up to its rows (its warp count first). A first
    write no longer autotunes for a minute: `kvlab.tune(op="store", ...)`, or KVLAB_STORE_AUTOTUNE=1 (Triton's
    autotuner on a key's first call, as before), finds a shape's best and records it. Cached (spec, D, Hk):
    `set_switches` clears it."""
    p = kernel_params(spec, D)
    if p["CHAN"] and p["FLAT"]:
        r, w = 64, 1
    elif p["ROT"]:
        r, w = (16, 4) if p["FMT"] == 3 else (16, 2)
    elif p["BITS"] == 16:
        r, w = 8, 4
    else:
        r, w = 32, 4
    cands = candidates(spec, D, Hk)  # within the autotuner's bound (`_prune`)
    cfg = StoreConfig(block_r=r, num_warps=w)
    if cfg not in cands:  # the largest kept tile up to r rows, this warp count first
        cfg = max((c for c in cands if c.block_r <= r), key=lambda c: (c.num_warps == w, c.block_r), default=cands[0])
    return cfg


def candidates(spec, D: int, Hk: int) -> list:
    """The `CANDIDATES` the autotuner would keep for `spec` at head_dim D (`_prune`'s bound), for `kvlab.tune`."""
    p = kernel_params(spec, D)
    cands = [triton.Config({"BLOCK_R": c.block_r}, num_warps=c.num_warps) for c in CANDIDATES]
    keep = {(c.kwargs["BLOCK_R"], c.num_warps) for c in _prune(cands, {}, D=D, HK=Hk, **p)}
    return [c for c in CANDIDATES if (c.block_r, c.num_warps) in keep]


def two_pass(p: dict) -> bool:
    """Whether the kernel constexprs `p` store in two launches: group-row specs with a rare exact fallback (IEEE
    division as a multiply, sorted-codebook brackets) keep it out of the main kernel (H200, int4:g32:asym 0.19 -> 0.58
    of copy with no fallback and no check: benchmarks/NOTES_store.md, session 16); the second launch recomputes only
    the programs the first flagged. Used only while TWO_PASS is on (off by default: no faster, session 17)."""
    return bool(p["FLAT"] and has_rare(p))


def has_rare(p: dict, safe: int | None = None) -> bool:
    """Whether kernels launched with constexprs `p` and SAFE `safe` (default p's, `_safe_mode`) compile a rare exact
    fallback and its check (the kernels' HAS_ODD): division ints but f16-scaled ones (SAFE 1), sorted brackets
    and codebooks but those in closed form (SAFE 2)."""
    safe = p["SAFE"] if safe is None else safe
    return bool(RARE_PATHS and ((p["FMT"] == 0 and not p["RECIP"] and safe != 1) or (p["FMT"] == 3 and p["CBS"] >= 1
                                                                                     and safe != 2)))
