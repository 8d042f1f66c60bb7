"""Token-axis groups stored one group a thread: the group-row kernel's math without its lanes' repeats and turns.

The group-row kernel (`triton._store_rows`) spreads a group's G elements over several lanes ([R, bytes] tiles whose
bytes run across lanes), so each lane repeats the group's own steps (the extremes' shuffles, the division to the
scale, its encoding, the checks) for the few elements it holds; a two-plane format (int3) turns its bytes through
shared memory, and a rotated spec spreads a token row over 16 lanes and exchanges four of the transform's seven stages
by shuffles. Here one thread holds a whole group: a program takes R = 32 x warps group rows, each loaded as G / 8
chunks of 8 consecutive elements (one 16-byte load each: Triton gives each thread one row) and joined in the thread
into the [R, G] tile (`_group`); every per-group value is an [R] tensor computed once.

  * statistics by in-thread reductions: max |x|, min / max with GGML's first-zero sign for a zero extreme, GGML's
    signed extreme (the largest magnitude, the first on ties), or the rms summed in float64;
  * the per-group work once (`_scales_out`), the rare-path check (`_odd`), the codes (`_codes`: the group-row kernel's
    own, same bytes; codebooks read their bin table by one 16-byte PTX load an element on the GPU, `lut_codes` WIDE,
    which keeps the tile's layout);
  * each bit plane packed into 32-bit words by in-thread sums of shifted codes (sequential or GGML-strided), one
    vector store a plane and group.
Rotated specs (ROT): a thread takes min(D, 32) elements of a token row, or a whole group where that is larger (a piece;
`piece`, `PIECE`), runs the Hadamard stages on the
piece's own index bits in registers and the lane bits by one pair exchange each (`_rotated_groups`), then cuts the
piece into its groups. Writes of TWO_PASS_MIN_TOKENS tokens or more run the rare exact path in a second launch.

Where it runs (`why_not`): token-axis groups of 16, 32 or 64 dividing D in a power-of-two count, int codes or sorted
codebooks and fp4 (any scale dtype, a tensor scale), one bit plane or two, every plane a whole number of 32-bit words;
Hadamard rotations the kernel fuses; not static or calibrated scales, nor outlier slots. `api.store` takes it only where
the offline counts favour it (`worth`: two-plane ints and every rotated spec) and only when ENABLED
(KVLAB_STORE_ROW_WALK=0 turns it off). On by default since session 29: its GPU tests passed on an sm_90 GPU (an
H100) and, at a 32K-token write there, it stored int3 0.0545 -> 0.0455 ms, int4_had 0.0763 -> 0.0567, lm2 0.0858 ->
0.0686 against the group-row kernel's tiles, bytes equal to the oracle's (nf4, which `worth` leaves out, 0.0671 ->
0.0689; sweeps/results/h100/runs/s29-store-a786f59, `benchmarks/NOTES_store.md`).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..configs import fuses_rotation
from ..tiles.exact import next_pow2
from .triton import (RARE_PATHS, _codebook, _codes, _hw_fp8, _nanmax, _nanmin, _negated, _odd, _scales_out, has_rare,
                     _raw_scale, _zero_signed, kernel_pages, kernel_params)

ENABLED = os.environ.get("KVLAB_STORE_ROW_WALK", "1") not in ("", "0")
# the row walk's sorted codebooks (lm2-lm4) keep their rare check and fixup pass unless this is on
# (KVLAB_STORE_CBSAFE_WALK=1, read at import): the closed form of `triton.codebook_safe` in one launch timed mixed on an
# H100 (32K-token write, of copy, check -> closed form: lm2 0.372 -> 0.386, lm3 0.327 -> 0.288, lm4 0.309 -> 0.323;
# sweeps/results/h100/runs/s31-store-84d4744/store_cbsafe.txt), so off
CODEBOOK_SAFE_WALK = os.environ.get("KVLAB_STORE_CBSAFE_WALK", "0") not in ("", "0")
WARPS = 4  # warps a program: R = 32 x WARPS groups
# rotated specs: a thread's piece of a token row holds min(D, PIECE) elements, at least a group (`piece`). 32 rather
# than 64 runs one more Hadamard stage on a lane bit and halves the registers (offline sm_90, int4_had 151 -> 64,
# +9% instructions); H100, 32K-token write, of copy, 64 -> 32 (sweeps/results/h100/runs/s31p-32a1da0/): int4_had 0.565 ->
# 0.643, int3:g32:asym:rot=had 0.505 -> 0.553, nf4:g32:rot=had 0.375 -> 0.398, fp4 e4m3 g16 0.335 -> 0.345,
# lm3:g32:rot=had 0.253 -> 0.316. KVLAB_STORE_ROW_PIECE=64 (read at import) for A/B runs
PIECE = int(os.environ.get("KVLAB_STORE_ROW_PIECE", "32"))
if PIECE not in (32, 64):
    raise ValueError(f"KVLAB_STORE_ROW_PIECE={PIECE}: the row walk's rotated pieces are 32 or 64 elements")
# the formats whose groups larger than the piece (the lm presets' 64) spread over the threads of their pieces, statistics
# and codes by the compiler's shuffles; any other such group makes the piece. Offline sm_90 (registers / instructions
# an element): lm2 156 / 44.6 -> 120 / 57.5, lm3 168 / 53.6 -> 96 / 64.8, lm4 206 / 44.4 -> 124 / 55.8. H100, 32K-token
# write, of copy, whole -> spread, two runs each (sweeps/results/h100/runs/s32h-c7aaa2d/store_split.txt): lm4 0.309 /
# 0.311 -> 0.331 / 0.329, lm3 0.324 / 0.326 -> 0.319 / 0.317, lm2 0.371 / 0.373 -> 0.341 / 0.338; so lm4 only.
# KVLAB_STORE_ROW_SPLIT (read at import): 0 none, 1 every format, or a comma-separated list of formats
SPLITTABLE = ("lm2", "lm3", "lm4")  # the formats whose groups (64) outgrow a 32-element piece
_SPLIT_ENV = os.environ.get("KVLAB_STORE_ROW_SPLIT", "lm4").strip()
SPLIT_GROUPS: bool | frozenset = (frozenset() if _SPLIT_ENV in ("", "0") else True if _SPLIT_ENV == "1"
                                  else frozenset(f.strip() for f in _SPLIT_ENV.split(",")))
if SPLIT_GROUPS is not True and not SPLIT_GROUPS <= set(SPLITTABLE):
    raise ValueError(f"KVLAB_STORE_ROW_SPLIT={_SPLIT_ENV}: 0, 1 or a comma-separated list of {', '.join(SPLITTABLE)}")
# writes of TWO_PASS_MIN_TOKENS tokens or more (a prefill's, where occupancy matters) code in two launches: the main
# pass without the exact path's registers (lm2:rot=had offline: 112 registers against 255 with it compiled in), then
# a fixup pass that only flagged programs enter; shorter writes (a decode step's) keep one launch
TWO_PASS = True
TWO_PASS_MIN_TOKENS = 512
LUT = True  # fixed codebooks by their bin table, read on the GPU by one 16-byte PTX load an element that keeps the
# tile's layout (`tiles.bracket.lut_codes` WIDE; Triton's own gathers took a layout of their own and turned the tile
# through shared memory); False: the bisection (`triton._sorted_codes`: selects over broadcast levels; the same codes)


@triton.jit
def _chunk(xr, c: tl.constexpr, sd, lm):
    """Elements 8c .. 8c + 7 of every group row ([R, 8] float32; rows outside lm read 0): one 16-byte load a thread."""
    i = tl.arange(0, 8)[None, :]
    return tl.load(xr + (8 * c + i) * sd, mask=lm, other=0.0).to(tl.float32)


@triton.jit
def _group(xr, sd, lm, G: tl.constexpr):
    """Every group row's G elements as [R, G] float32 in one thread: its G / 8 chunks joined (tl.join adds an axis
    inside the thread) and put back in element order."""
    R: tl.constexpr = xr.shape[0]
    f0 = _chunk(xr, 0, sd, lm)
    f1 = _chunk(xr, 1, sd, lm)
    if G == 16:
        f = tl.reshape(tl.permute(tl.join(f0, f1), [0, 2, 1]), [R, 16])  # [r, i, k] = chunk k
    else:
        f2 = _chunk(xr, 2, sd, lm)
        f3 = _chunk(xr, 3, sd, lm)
        q = tl.join(tl.join(f0, f1), tl.join(f2, f3))  # [r, i, k, m] = chunk 2 m + k
        if G == 32:
            f = tl.reshape(tl.permute(q, [0, 3, 2, 1]), [R, 32])
        else:
            f4 = _chunk(xr, 4, sd, lm)
            f5 = _chunk(xr, 5, sd, lm)
            f6 = _chunk(xr, 6, sd, lm)
            f7 = _chunk(xr, 7, sd, lm)
            o = tl.join(tl.join(f4, f5), tl.join(f6, f7))
            f = tl.reshape(tl.permute(tl.join(q, o), [0, 4, 3, 2, 1]), [R, 64])  # [r, i, k, m, n]: chunk 4 n + 2 m + k
    return f


@triton.jit
def _piece(xr, sd, lm, E: tl.constexpr):
    """E = 32 or 64 consecutive elements of every piece row as [R, E] float32 in its thread (`_group`'s joins)."""
    R: tl.constexpr = xr.shape[0]
    if E == 32:
        f = _group(xr, sd, lm, 32)
    else:
        a = _group(xr, sd, lm, 32)
        b = _group(xr + 32 * sd, sd, lm, 32)
        f = tl.reshape(tl.permute(tl.join(a, b), [0, 2, 1]), [R, 64])
    return f


@triton.jit
def _rotated_groups(x_ptr, pid, T, st, sh, sd, h, D: tl.constexpr, G: tl.constexpr, RP: tl.constexpr,
                    LOG: tl.constexpr, RC: tl.constexpr, E: tl.constexpr, LOGE: tl.constexpr):
    """The Hadamard-rotated group rows of RP / LPR tokens ([RP E / G, G] float32, E = `piece(D, G)` elements a thread,
    LPR = D / E lanes a token row): each thread loads E consecutive elements of a row (a piece), runs the transform's
    stages on the piece's own index bits in registers (the oracle's constant-geometry stage: pairs (2k, 2k + 1), sums
    then differences), then the stages on the lane bits in place by a pair exchange (`fwht_rows_in_place`'s: the sum
    at the clear bit, a + (-b) at the set one), and scales by RC = 1 / sqrt(D): the oracle's additions in its order,
    so its bits. Returns (group rows, their mask of tokens < T)."""
    LPR: tl.constexpr = D // E
    p = tl.arange(0, RP)
    t = pid * (RP // LPR) + p // LPR
    xr = (x_ptr + t.to(tl.int64) * st + h * sh + (p % LPR) * E * sd)[:, None]
    x = _piece(xr, sd, (t < T)[:, None], E)
    for _ in tl.static_range(LOGE):  # the piece's own bits, constant geometry (the order comes back after LOGE)
        a, b = tl.split(tl.reshape(x, [RP, E // 2, 2]))
        x = tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 2, 1)), [RP, E])
    for s in tl.static_range(LOG - LOGE):  # the lane bits: piece index bit s, in place
        y = tl.reshape(x, [RP >> (s + 1), 2, 1 << s, E])
        yb = y.to(tl.int32, bitcast=True)
        pb = yb ^ tl.xor_sum(yb, axis=1, keep_dims=True)
        hi = tl.arange(0, 2)[None, :, None, None]
        x = tl.reshape(pb.to(tl.float32, bitcast=True) + (yb ^ (hi << 31)).to(tl.float32, bitcast=True), [RP, E])
    x = x * RC
    return tl.reshape(x, [RP * E // G, G])


@triton.jit
def _first_at(cond, G: tl.constexpr):
    """Per row: the first element index where cond holds ([R]; G where none)."""
    return tl.min(tl.where(cond, tl.arange(0, G)[None, :], G), axis=1)


@triton.jit
def _sign_at(f, j, G: tl.constexpr):
    """Per row: 1 where element j of f ([R, G]) has its sign bit set."""
    at = tl.arange(0, G)[None, :] == j[:, None]
    return tl.max(tl.where(at, (f.to(tl.int32, bitcast=True) < 0).to(tl.int32), 0), axis=1)


@triton.jit
def _plane_words(u, G: tl.constexpr, SH: tl.constexpr, W: tl.constexpr, STR: tl.constexpr):
    """One bit plane of the codes u [R, G] packed into its G W / 32 words ([R, NW] int32, in the thread): sequential
    element e at bit W e; GGML-strided (e = k NBP + j, NBP = G W / 8 bytes) at byte j, bits W k."""
    R: tl.constexpr = u.shape[0]
    NW: tl.constexpr = G * W // 32
    K: tl.constexpr = 8 // W
    p = (u >> SH) & ((1 << W) - 1)
    if STR:
        NBP: tl.constexpr = G * W // 8
        p = tl.reshape(tl.permute(tl.reshape(p, [R, K, NBP]), [0, 2, 1]), [R, G])  # byte-major: [j, k]
        e = tl.arange(0, G)
        pos = 8 * ((e // K) % 4) + W * (e % K)  # within the word: byte j mod 4, bits W k
    else:
        pos = (W * tl.arange(0, G)) % 32
    return tl.sum(tl.reshape(p << pos[None, :], [R, NW, G // NW]), axis=2)


@triton.jit
def _row_walk_kernel(x_ptr, codes_ptr, scales_ptr, zeros_ptr, slot_ptr, ts_ptr, cb_ptr, flag_ptr, T, st, sh, sd,
                     HK: tl.constexpr, D: tl.constexpr, P: tl.constexpr, G: tl.constexpr, NG: tl.constexpr,
                     R: tl.constexpr, FMT: tl.constexpr, SYM: tl.constexpr, RULE: tl.constexpr, RND: tl.constexpr,
                     RECIP: tl.constexpr, SDT: tl.constexpr, SDIV: tl.constexpr, ELEM_INT: tl.constexpr,
                     HAS_TS: tl.constexpr, OFF: tl.constexpr, QMAX: tl.constexpr, XORC: tl.constexpr,
                     HW: tl.constexpr, CBS: tl.constexpr, LUT: tl.constexpr, BOUND: tl.constexpr, SAFE: tl.constexpr,
                     W0: tl.constexpr, SH0: tl.constexpr, ST0: tl.constexpr, W1: tl.constexpr, SH1: tl.constexpr,
                     ST1: tl.constexpr, ROT: tl.constexpr, RC: tl.constexpr, RP: tl.constexpr, E: tl.constexpr,
                     LOGE: tl.constexpr, PASS: tl.constexpr):
    """PASS 0: one launch (a program with a rare element recodes itself by the exact path); 1: the main pass of two
    (fast codes only, flag_ptr[program] = whether it has a rare element), so the exact path's registers are not the
    kernel's; 2: the fixup pass, entered by flagged programs only (the exact codes)."""
    prog = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    if PASS != 2 or tl.load(flag_ptr + prog) != 0:
        _row_walk_body(x_ptr, codes_ptr, scales_ptr, zeros_ptr, slot_ptr, ts_ptr, cb_ptr, flag_ptr, prog, T, st, sh,
                       sd, HK, D, P, G, NG, R, FMT, SYM, RULE, RND, RECIP, SDT, SDIV, ELEM_INT, HAS_TS, OFF, QMAX, XORC,
                       HW, CBS, LUT, BOUND, SAFE, W0, SH0, ST0, W1, SH1, ST1, ROT, RC, RP, E, LOGE, PASS)


@triton.jit
def _row_walk_body(x_ptr, codes_ptr, scales_ptr, zeros_ptr, slot_ptr, ts_ptr, cb_ptr, flag_ptr, prog, T, st, sh, sd,
                   HK: tl.constexpr, D: tl.constexpr, P: tl.constexpr, G: tl.constexpr, NG: tl.constexpr,
                   R: tl.constexpr, FMT: tl.constexpr, SYM: tl.constexpr, RULE: tl.constexpr, RND: tl.constexpr,
                   RECIP: tl.constexpr, SDT: tl.constexpr, SDIV: tl.constexpr, ELEM_INT: tl.constexpr,
                   HAS_TS: tl.constexpr, OFF: tl.constexpr, QMAX: tl.constexpr, XORC: tl.constexpr,
                   HW: tl.constexpr, CBS: tl.constexpr, LUT: tl.constexpr, BOUND: tl.constexpr, SAFE: tl.constexpr,
                   W0: tl.constexpr, SH0: tl.constexpr, ST0: tl.constexpr, W1: tl.constexpr, SH1: tl.constexpr,
                   ST1: tl.constexpr, ROT: tl.constexpr, RC: tl.constexpr, RP: tl.constexpr, E: tl.constexpr,
                   LOGE: tl.constexpr, PASS: tl.constexpr):
    """Group rows q of head h: token pid R / NG + q // NG, group q % NG (see the module docstring). ROT = log2 D > 0:
    the rows are rotated first (`_rotated_groups`: RP pieces, R = RP x min(D, 64) / G group rows)."""
    h = tl.program_id(1)
    q = tl.arange(0, R)
    t = tl.program_id(0) * (R // NG) + q // NG
    g = q % NG
    slot = tl.load(slot_ptr + t, mask=t < T, other=-1).to(tl.int64)
    live = (t < T) & (slot >= 0)
    unit = ((slot // P * HK + h) * P + slot % P) * NG + g  # [R] group index in the pages
    if ROT > 0:
        f = _rotated_groups(x_ptr, tl.program_id(0), T, st, sh, sd, h, D, G, RP, ROT, RC, E, LOGE)  # [R, G]
    else:
        xr = (x_ptr + t.to(tl.int64) * st + h * sh + g * G * sd)[:, None]  # [R, 1]
        f = _group(xr, sd, (t < T)[:, None], G)  # [R, G]
    m_raw = tl.zeros([R], tl.float32)
    if RULE == 3:  # rms (Lloyd-Max): sqrt(mean x^2), the squares summed in float64 and rounded once, as the oracle
        xd = f.to(tl.float64)
        stat = tl.sqrt(tl.sum(xd * xd, axis=1) / G).to(tl.float32)  # NaN with a NaN element, inf with an inf
        bad = ~(stat < float("inf"))
    elif SYM:
        a = tl.abs(f)
        stat = tl.reduce(a, 1, _nanmax)  # NaN-propagating max |x|
        bad = ~(stat < float("inf"))
        if RULE == 1:  # GGML's signed extreme: the largest magnitude, the first one on ties, with its sign
            neg = _sign_at(f, _first_at(a == stat[:, None], G), G)
            stat = tl.where(neg > 0, _negated(stat), stat)
    else:
        mx = tl.reduce(f, 1, _nanmax)
        mn = tl.reduce(f, 1, _nanmin)
        mx = tl.where(mx != mx, float("nan"), mx)  # canonical NaN, as the oracle
        mn = tl.where(mn != mn, float("nan"), mn)
        if tl.max((((mx == 0) | (mn == 0)) & live).to(tl.int32)) > 0:  # rare: a zero extreme is the first zero
            zero = _zero_signed(_sign_at(f, _first_at(f == 0, G), G), mx)
            mx = tl.where(mx == 0, zero, mx)
            mn = tl.where(mn == 0, zero, mn)
        bad = ~((tl.abs(mx) < float("inf")) & (tl.abs(mn) < float("inf")))
        stat = mx - mn
        m_raw = mn
    s_raw, m_raw = _raw_scale(stat, m_raw, bad, ts_ptr, SDIV, HAS_TS)  # a non-finite element: both NaN
    s_val, m_val, s_eff = _scales_out(s_raw, m_raw, scales_ptr, zeros_ptr, ts_ptr, unit, live, SYM, False, RULE, SDT,
                                      ELEM_INT, HAS_TS)
    sr, sv, mr, mv, se = s_raw[:, None], s_val[:, None], m_raw[:, None], m_val[:, None], s_eff[:, None]
    QSAFE: tl.constexpr = SAFE == 1  # (`triton.quotient_safe`)
    CBSAFE: tl.constexpr = SAFE == 2  # (`triton.codebook_safe`)
    HAS_ODD: tl.constexpr = RARE_PATHS and ((FMT == 0 and not RECIP and not QSAFE) or (FMT == 3 and CBS >= 1
                                                                                       and not CBSAFE))
    if HAS_ODD and PASS == 2:  # the fixup pass of a flagged program: the exact codes
        u = _codes(f, sr, sv, mr, mv, se, cb_ptr, FMT, SYM, RULE, RND, RECIP, OFF, QMAX, XORC, HW, CBS, 2, LUT, True)
    elif HAS_ODD:  # the fast codes, then one check a program for the rare exact path
        u = _codes(f, sr, sv, mr, mv, se, cb_ptr, FMT, SYM, RULE, RND, RECIP, OFF, QMAX, XORC, HW, CBS, 1, LUT, True)
        odd = tl.max(tl.where(live[:, None], _odd(f, sr, sv, mr, mv, se, cb_ptr, FMT, SYM, RECIP, OFF, CBS,
                                                  BOUND or FMT == 0), 0))
        if PASS == 1:
            tl.store(flag_ptr + prog, odd)
        elif odd > 0:  # rare: every group of the program by the exact path
            u = _codes(f, sr, sv, mr, mv, se, cb_ptr, FMT, SYM, RULE, RND, RECIP, OFF, QMAX, XORC, HW, CBS, 2, LUT, True)
    else:
        u = _codes(f, sr, sv, mr, mv, se, cb_ptr, FMT, SYM, RULE, RND, RECIP, OFF, QMAX, XORC, HW, CBS,
                   3 if CBSAFE else (1 if QSAFE else 0), LUT, True)
    GB: tl.constexpr = G * (W0 + W1) // 8
    NW0: tl.constexpr = G * W0 // 32
    base = codes_ptr.to(tl.pointer_type(tl.int32)) + unit[:, None] * (GB // 4)
    tl.store(base + tl.arange(0, NW0)[None, :], _plane_words(u, G, SH0, W0, ST0), mask=live[:, None])
    if W1 > 0:
        NW1: tl.constexpr = G * W1 // 32
        tl.store(base + NW0 + tl.arange(0, NW1)[None, :], _plane_words(u, G, SH1, W1, ST1), mask=live[:, None])


def why_not(spec, D: int) -> str | None:
    """None when this kernel stores `spec` (the launched spec) at head_dim D; else why not."""
    if spec.axis != "tok":
        return "not a token-axis spec"
    if spec.is_float_storage or spec.fmt.startswith("fp8"):
        return f"{spec}: 16-bit and fp8 storage keep the group-row kernel"
    if spec.calibrated or spec.static_scale or spec.outliers or spec.rule not in ("absmax", "full", "signed", "rms"):
        return f"{spec}: no calibrated, static, unit-scale or outlier-slot specs in the row walk"
    if spec.rotation != "none" and not (fuses_rotation(spec, D) and 32 <= D <= 256 and spec.group_size(D) <= min(D, 64)):
        return f"{spec}: a rotated spec walks where the kernel rotates whole rows of 32-256 (one Hadamard block)"
    if spec.rule in ("full", "signed") and not spec.sym:
        return f"{spec}: rule {spec.rule} is symmetric"
    G = spec.group_size(D)
    if G not in (16, 32, 64) or D % G:
        return f"{spec}: groups of 16, 32 or 64 elements dividing head_dim {D}"
    if (D // G) & (D // G - 1):
        return f"{spec}: a power-of-two count of groups a row (head_dim {D} / {G} = {D // G}): a program's rows are whole"
    p = kernel_params(spec, D)
    if p["FMT"] not in (0, 3) or p["W2"] > 0 or (p["FMT"] == 3 and p["CBS"] < 1):
        return f"{spec}: int codes or a sorted codebook, in one or two bit planes"
    for w in (p["W0"], p["W1"]):
        if w and (G * w) % 32:
            return f"{spec}: every bit plane a whole number of 32-bit words (G x bits = {G * w})"
    return None


def fits(pages: dict) -> bool:
    """The pages' codes start on a 4-byte boundary (the packed words are stored as int32)."""
    return pages["codes"].data_ptr() % 4 == 0


def worth(spec, D: int) -> bool:
    """Where `api.store` takes the row walk when ENABLED (a spec it can store, `why_not`): int codes in two bit planes
    (int3, int5, int6), and every Hadamard-rotated int or codebook spec (int4_had, lm2-lm4 and nf4 / fp4 with rot=had).
    Offline sm_90, instructions an element, the walk's main pass (two launches, as a prefill's write runs it) against
    the group-row kernel's hot path at its tiles (`python -m devtools.store_sass_offline SPEC [--row-walk | --hot]`;
    32 x 4, rotated 16 x 2 / 16 x 4):
      int3 23.2 / 28.8; int4_had 39.6 (140 registers) / 76.8; int3:g32:asym:rot=had 39.1 / 95.2;
      lm2 / lm3 / lm4 rot=had 44.2 / 54.6 / 43.2 against 82.5 / 94.0 / 85.0; nf4:g32:rot=had 40.1 / 57.0;
      fp4 rot=had (e8m0 g32; e4m3 g16 with a tensor scale) 45.9 / 86.5 and 50.6 / 76.5
    (those with 64-element pieces; 32-element ones, `PIECE`: int4_had 43.8 at 64 registers, faster on an H100)
    (the transform's stages on a thread's piece are plain adds, one pair exchange a lane bit; the codebooks' bin
    table read by one 16-byte PTX load an element that keeps the tile's layout). Not the unrotated one-plane specs:
    ints run no fewer (int2 18.2 / 18.2, int4:g32:asym 32.0 / 30.5, q4_0 26.5 / 21.0: the signed extreme's first index
    costs more in one thread than the shuffles did), codebooks about as many at twice the registers (nf4 28.6 at 121
    registers / 33.8 at 55, mxfp4 38.5 / 38.8, iq4nl 40.2 / 35.5, nvfp4 49.0 / 41.2)."""
    p = kernel_params(spec, D)
    if p["FMT"] == 0:
        return p["W1"] > 0 or p["ROT"] > 0
    return p["FMT"] == 3 and p["ROT"] > 0


def run(x: torch.Tensor, pages: dict, slot_mapping: torch.Tensor, spec, page_size: int, *,
        tensor_scale: torch.Tensor | None = None) -> None:
    """Launch the row walk: x [T, Hk, D] (16-bit or float32), pages of `PageLayout(spec, D, page_size, Hk)`,
    slot_mapping [T] (-1 skips a token), tensor_scale float32 [1] for specs that need one (checked by `api.store`)."""
    T, Hk, D = x.shape
    if T == 0:
        return
    p = kernel_params(spec, D)
    G = spec.group_size(D)
    NG = D // G
    R = max(32 * WARPS, next_pow2(NG))
    RP = 32 * WARPS  # rotated: pieces of `piece(D, G)` elements, one a thread
    E = piece(D, G, spec.fmt)
    if p["ROT"]:
        R = RP * E // G
    codes, scales, zeros, dummy = kernel_pages(pages, x.device)
    ts = tensor_scale if tensor_scale is not None else dummy
    grid = (triton.cdiv(T * NG, R), Hk)
    safe = walk_safe(p)
    two = TWO_PASS and has_rare(p, safe) and T >= TWO_PASS_MIN_TOKENS
    flags = torch.empty(grid[0] * grid[1], dtype=torch.int32, device=x.device) if two else dummy
    for pas in ((1, 2) if two else (0,)):
        _launch(grid, pas, x, codes, scales, zeros, slot_mapping.contiguous(), ts, _codebook(spec.fmt, x.device),
                flags, T, Hk, D, page_size, G, NG, R, RP, E, p, safe)


def piece(D: int, G: int, fmt: str | None = None) -> int:
    """Elements of a token row one thread takes in a rotated walk: min(D, PIECE), never less than a group unless the
    spec's format `fmt` spreads its groups (`SPLIT_GROUPS`)."""
    split = SPLIT_GROUPS is True or (fmt is not None and fmt in SPLIT_GROUPS)
    return min(D, PIECE) if split else max(G, min(D, PIECE))


def walk_safe(p: dict) -> int:
    """The row walk's constexpr SAFE for `kernel_params` p: theirs (`triton.quotient_safe` 1, `triton.codebook_safe` 2),
    but 0 for a sorted codebook's closed form unless `CODEBOOK_SAFE_WALK`."""
    return 0 if p["SAFE"] == 2 and not CODEBOOK_SAFE_WALK else p["SAFE"]


def _launch(grid, pas, x, codes, scales, zeros, slots, ts, cb, flags, T, Hk, D, page_size, G, NG, R, RP, E, p, safe):
    _row_walk_kernel[grid](
        x, codes, scales, zeros, slots, ts, cb, flags, T, *x.stride(),
        HK=Hk, D=D, P=page_size, G=G, NG=NG, R=R, FMT=p["FMT"], SYM=p["SYM"], RULE=p["RULE"], RND=p["RND"],
        RECIP=p["RECIP"], SDT=p["SDT"], SDIV=p["SDIV"], ELEM_INT=p["ELEM_INT"], HAS_TS=p["HAS_TS"], OFF=p["OFF"],
        QMAX=p["QMAX"], XORC=p["XORC"], HW=_hw_fp8(x.device), CBS=p["CBS"], LUT=p["LUT"] if LUT else 0,
        BOUND=p["BOUND"], SAFE=safe,
        W0=p["W0"], SH0=p["SH0"], ST0=bool(p["ST0"]), W1=p["W1"], SH1=p["SH1"], ST1=bool(p["ST1"]),
        ROT=p["ROT"], RC=p["RC"], RP=RP, E=E, LOGE=E.bit_length() - 1, PASS=pas, num_warps=WARPS,
        enable_fp_fusion=False)
