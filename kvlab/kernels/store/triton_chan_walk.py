"""Channel-axis groups (KIVI keys) stored by walking the group's tokens, one thread per channel block.

A channel-axis group is G consecutive tokens of one channel; its scale and zero come from the min / max over those
tokens and its codes pack along them (`kvlab/quant/oracle.py`, `PageLayout`: each channel's G codes are GB = G bits / 8
contiguous bytes). The group-row kernel (`triton._store_rows`, CHAN) takes a channel's G tokens as one row of a tile
whose lanes run along tokens, so every reduction over tokens is a warp shuffle and every per-group step (the scale's
division and rounding to f16, the zero, the checks) is repeated by each lane that holds a piece of the row: offline
sm_90 at its fastest tile (64 channels on one warp) that is 47 instructions an element on the hot path against 21 for
q4_0 (`benchmarks/NOTES_store.md`), and the H200 ran kivi4 keys at 0.32 of the copy bandwidth.

Here a program takes one group of G tokens for HB heads, as a [HB, D] tile of channels that every load shares: the
tile's last axis is the token row's contiguous channels, so Triton gives each thread 8 of them (one 16-byte load per
token) and the same 8 channels for every token of the group. Everything per channel then stays in that thread:
  * pass 1 walks the G tokens, keeping the NaN-propagating max and min (on the GPU in x's own 16-bit dtype);
  * the per-group work (statistics to scale and zero, their encoding and stores, the rare checks) runs once per
    channel, on [HB, D] tensors: the same helpers as the group-row kernel (`_scales_out`, `_odd`, `_codes`), so the
    bytes are the same;
  * pass 2 walks the tokens again (an L1 / L2 hit: the group's rows were just read), codes each (`_codes`: Markstein's
    quotient, `cvt.rni` on the GPU) and shifts it into its place in the channel's packed words, built in registers;
    the words go out as one vector store per channel (16 bytes for int4 at G 32).
A zero extreme (the oracle takes the first zero's sign, GGML's rule) sends the program through one more walk for the
first zero (rare); a scale whose reciprocal is out of Markstein's range (past 2^+-100) codes the whole group by IEEE
division (rare, one check per program; a second launch for writes of TWO_PASS_MIN_TOKENS tokens or more, so that path's
registers are not the main pass's).

Where it runs (`why_not`): int codes of 2, 4 or 8 bits on one bit plane (asym, or sym with absmax statistics), a
group's packed bytes a whole number of 32-bit words up to eight (G x bits in 32..256), no rotation, static, tensor or
calibrated scale. `api.store` calls it where `ENABLED` (KVLAB_STORE_CHAN_WALK=0 turns it off): on by default since
session 29, with pass 2 a word at a time (`WORD_LOOP`). Its GPU tests passed on an sm_90 GPU (an H100), and at a
32K-token write there it stored kivi4 0.0766 -> 0.0679 ms and kivi2 0.0765 -> 0.0601 against the group-row kernel's
64 x 1 tiles, bytes equal to the oracle's (with pass 2 a whole group at a time: 0.0771 / 0.0736;
sweeps/results/h100/runs/s29-store-a786f59).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..env import interpreting
from ..tiles.exact import next_pow2
from .triton import (RARE_PATHS, _codes, _hw_fp8, _nanmax, _nanmin, _odd, _raw_scale, _scales_out, _zero_signed,
                     has_rare, kernel_pages, kernel_params)

ENABLED = os.environ.get("KVLAB_STORE_CHAN_WALK", "1") not in ("", "0")
# channels a thread holds: 8 (one 16-byte load of a 16-bit token row, 4 warps for 8 heads at head_dim 128) or 4 (8-byte
# loads, 8 warps). Offline sm_90 (device Triton 3.6, two-pass main kernel, word loop): kivi4 154 -> 124 registers, kivi2
# 162 -> 100, for +8% / +9% instructions an element; prepared and untimed (`bash benchmarks/h200_run.sh s32s` A/B's it;
# ncu on an H100 put kivi4 at 17% occupancy, latency-bound: sweeps/results/h100/runs/s31-store-84d4744/).
# KVLAB_STORE_CHAN_LANE (read at import) picks it
LANE_ELEMS = int(os.environ.get("KVLAB_STORE_CHAN_LANE", "8"))
if LANE_ELEMS not in (4, 8):
    raise ValueError(f"KVLAB_STORE_CHAN_LANE={LANE_ELEMS}: the channel walk's threads hold 4 or 8 channels")
MAXNREG = None  # a register cap per thread (None: the compiler's choice)
WORD_LOOP = True  # pass 2 a packed word at a time, each word stored alone (fewer registers; constexpr WL)
# writes of TWO_PASS_MIN_TOKENS tokens or more code in two launches: the main pass without the IEEE-division path's
# registers (offline kivi4: 255 registers and a 120-byte stack with it compiled in, 210 without), then a fixup pass
# that only programs with an out-of-range scale enter; shorter writes keep one launch
TWO_PASS = True
TWO_PASS_MIN_TOKENS = 512


@triton.jit
def _word(xb, lm, st, sr, sv, mr, mv, se, cb_ptr, WI: tl.constexpr, W: tl.constexpr, NB: tl.constexpr,
          STR: tl.constexpr, FMT: tl.constexpr, SYM: tl.constexpr, RULE: tl.constexpr, RND: tl.constexpr,
          RECIP: tl.constexpr, OFF: tl.constexpr, QMAX: tl.constexpr, XORC: tl.constexpr, HW: tl.constexpr,
          MODE: tl.constexpr):
    """int32 word WI of every channel's packed codes ([HB, D]): bytes 4 WI .. 4 WI + 3, little-endian. Element k of
    byte j is token k NB + j (GGML-strided, STR) or j K + k (sequential), at bits W k of its byte."""
    K: tl.constexpr = 8 // W
    word = tl.zeros(lm.shape, tl.int32)
    for b in tl.static_range(4):
        for k in tl.static_range(K):
            i = STR * (k * NB + 4 * WI + b) + (1 - STR) * ((4 * WI + b) * K + k)  # the token (a constexpr)
            x = tl.load(xb + i * st, mask=lm, other=0.0).to(tl.float32)
            u = _codes(x, sr, sv, mr, mv, se, cb_ptr, FMT, SYM, RULE, RND, RECIP, OFF, QMAX, XORC, HW, 0, MODE, 0)
            word = word | (u << (8 * b + W * k))
    return word


@triton.jit
def _word_at(xb, lm, st, wi, sr, sv, mr, mv, se, cb_ptr, W: tl.constexpr, NB: tl.constexpr, STR: tl.constexpr,
             FMT: tl.constexpr, SYM: tl.constexpr, RULE: tl.constexpr, RND: tl.constexpr, RECIP: tl.constexpr,
             OFF: tl.constexpr, QMAX: tl.constexpr, XORC: tl.constexpr, HW: tl.constexpr, MODE: tl.constexpr):
    """`_word` for a word index wi known at run time only (the token offsets move with it, the shifts do not)."""
    K: tl.constexpr = 8 // W
    word = tl.zeros(lm.shape, tl.int32)
    for b in tl.static_range(4):
        for k in tl.static_range(K):
            i = STR * (k * NB + 4 * wi + b) + (1 - STR) * ((4 * wi + b) * K + k)
            x = tl.load(xb + i * st, mask=lm, other=0.0).to(tl.float32)
            u = _codes(x, sr, sv, mr, mv, se, cb_ptr, FMT, SYM, RULE, RND, RECIP, OFF, QMAX, XORC, HW, 0, MODE, 0)
            word = word | (u << (8 * b + W * k))
    return word


@triton.jit
def _words(xb, lm, st, sr, sv, mr, mv, se, cb_ptr, NW: tl.constexpr, W: tl.constexpr, NB: tl.constexpr,
           STR: tl.constexpr, FMT: tl.constexpr, SYM: tl.constexpr, RULE: tl.constexpr, RND: tl.constexpr,
           RECIP: tl.constexpr, OFF: tl.constexpr, QMAX: tl.constexpr, XORC: tl.constexpr, HW: tl.constexpr,
           MODE: tl.constexpr):
    """Every channel's NW packed words as [HB, D, NW] (word w at index w): joined in registers, so each channel's
    bytes leave in one vector store."""
    w0 = _word(xb, lm, st, sr, sv, mr, mv, se, cb_ptr, 0, W, NB, STR, FMT, SYM, RULE, RND, RECIP, OFF, QMAX, XORC, HW,
               MODE)
    if NW == 1:
        out = tl.expand_dims(w0, 2)
    else:
        w1 = _word(xb, lm, st, sr, sv, mr, mv, se, cb_ptr, 1, W, NB, STR, FMT, SYM, RULE, RND, RECIP, OFF, QMAX, XORC,
                   HW, MODE)
        if NW == 2:
            out = tl.join(w0, w1)
        else:
            w2 = _word(xb, lm, st, sr, sv, mr, mv, se, cb_ptr, 2, W, NB, STR, FMT, SYM, RULE, RND, RECIP, OFF, QMAX,
                       XORC, HW, MODE)
            w3 = _word(xb, lm, st, sr, sv, mr, mv, se, cb_ptr, 3, W, NB, STR, FMT, SYM, RULE, RND, RECIP, OFF, QMAX,
                       XORC, HW, MODE)
            # tl.join adds the new axis last, and a reshape reads the last axis fastest: the last join takes the even
            # and odd words, so [i, j] (four words) holds word 2 i + j and [i, j, k] (eight) word 4 i + 2 j + k
            if NW == 4:
                q = tl.join(tl.join(w0, w2), tl.join(w1, w3))
                out = tl.reshape(q, [q.shape[0], q.shape[1], 4])
            else:
                w4 = _word(xb, lm, st, sr, sv, mr, mv, se, cb_ptr, 4, W, NB, STR, FMT, SYM, RULE, RND, RECIP, OFF,
                           QMAX, XORC, HW, MODE)
                w5 = _word(xb, lm, st, sr, sv, mr, mv, se, cb_ptr, 5, W, NB, STR, FMT, SYM, RULE, RND, RECIP, OFF,
                           QMAX, XORC, HW, MODE)
                w6 = _word(xb, lm, st, sr, sv, mr, mv, se, cb_ptr, 6, W, NB, STR, FMT, SYM, RULE, RND, RECIP, OFF,
                           QMAX, XORC, HW, MODE)
                w7 = _word(xb, lm, st, sr, sv, mr, mv, se, cb_ptr, 7, W, NB, STR, FMT, SYM, RULE, RND, RECIP, OFF,
                           QMAX, XORC, HW, MODE)
                e = tl.join(tl.join(w0, w4), tl.join(w2, w6))
                o = tl.join(tl.join(w1, w5), tl.join(w3, w7))
                out = tl.reshape(tl.join(e, o), [e.shape[0], e.shape[1], 8])
    return out


@triton.jit
def _chan_walk_kernel(x_ptr, codes_ptr, scales_ptr, zeros_ptr, slot_ptr, ts_ptr, cb_ptr, flag_ptr, st, sh, sd,
                      HK: tl.constexpr, HB: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, P: tl.constexpr,
                      G: tl.constexpr, W: tl.constexpr, STR: tl.constexpr, FMT: tl.constexpr, SYM: tl.constexpr,
                      RULE: tl.constexpr, RND: tl.constexpr, RECIP: tl.constexpr, SDT: tl.constexpr,
                      SDIV: tl.constexpr, ELEM_INT: tl.constexpr, OFF: tl.constexpr, QMAX: tl.constexpr,
                      XORC: tl.constexpr, HW: tl.constexpr, NATIVE: tl.constexpr, WL: tl.constexpr,
                      SAFE: tl.constexpr, PASS: tl.constexpr):
    """PASS 0: one launch (a program whose scale is out of Markstein's range codes by IEEE division itself); 1: the
    main pass of two (fast codes only; flag_ptr[program] = whether it needs the exact path), so the exact path's
    registers are not the kernel's; 2: the fixup pass, entered by flagged programs only."""
    prog = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    if PASS != 2 or tl.load(flag_ptr + prog) != 0:
        _chan_walk_body(x_ptr, codes_ptr, scales_ptr, zeros_ptr, slot_ptr, ts_ptr, cb_ptr, flag_ptr, prog, st, sh, sd,
                        HK, HB, D, DP, P, G, W, STR, FMT, SYM, RULE, RND, RECIP, SDT, SDIV, ELEM_INT, OFF, QMAX, XORC,
                        HW, NATIVE, WL, SAFE, PASS)


@triton.jit
def _emit(xb, rok, live, unit, codes_ptr, st, sr, sv, mr, mv, se, cb_ptr, NW: tl.constexpr, W: tl.constexpr,
          NB: tl.constexpr, STR: tl.constexpr, FMT: tl.constexpr, SYM: tl.constexpr, RULE: tl.constexpr,
          RND: tl.constexpr, RECIP: tl.constexpr, OFF: tl.constexpr, QMAX: tl.constexpr, XORC: tl.constexpr,
          HW: tl.constexpr, WL: tl.constexpr, MODE: tl.constexpr):
    """Pass 2 with codes by MODE: every channel's packed words, made and stored (whole, or WL a word at a time)."""
    if WL:  # a word at a time (fewer registers live), each stored as it is made
        wp = codes_ptr.to(tl.pointer_type(tl.int32)) + unit * NW
        for wi in tl.range(NW, loop_unroll_factor=1):
            wd = _word_at(xb, rok, st, wi, sr, sv, mr, mv, se, cb_ptr, W, NB, STR, FMT, SYM, RULE, RND, RECIP, OFF,
                          QMAX, XORC, HW, MODE)
            tl.store(wp + wi, wd, mask=live)
    else:
        words = _words(xb, rok, st, sr, sv, mr, mv, se, cb_ptr, NW, W, NB, STR, FMT, SYM, RULE, RND, RECIP, OFF, QMAX,
                       XORC, HW, MODE)
        wptr = codes_ptr.to(tl.pointer_type(tl.int32)) + unit[:, :, None] * NW + tl.arange(0, NW)[None, None, :]
        tl.store(wptr, words, mask=live[:, :, None])


@triton.jit
def _chan_walk_body(x_ptr, codes_ptr, scales_ptr, zeros_ptr, slot_ptr, ts_ptr, cb_ptr, flag_ptr, prog, st, sh, sd,
                    HK: tl.constexpr, HB: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, P: tl.constexpr,
                    G: tl.constexpr, W: tl.constexpr, STR: tl.constexpr, FMT: tl.constexpr, SYM: tl.constexpr,
                    RULE: tl.constexpr, RND: tl.constexpr, RECIP: tl.constexpr, SDT: tl.constexpr,
                    SDIV: tl.constexpr, ELEM_INT: tl.constexpr, OFF: tl.constexpr, QMAX: tl.constexpr,
                    XORC: tl.constexpr, HW: tl.constexpr, NATIVE: tl.constexpr, WL: tl.constexpr,
                    SAFE: tl.constexpr, PASS: tl.constexpr):
    """Group grp (tokens grp G .. grp G + G - 1, one slot block), heads hb HB .. hb HB + HB - 1: scales, zeros and
    packed codes of every channel (see the module docstring)."""
    grp = tl.program_id(0)
    hh = tl.program_id(1) * HB + tl.arange(0, HB)[:, None]  # [HB, 1]
    c = tl.arange(0, DP)[None, :]  # [1, DP]
    rok = (hh < HK) & (c < D)  # [HB, DP]
    slot = tl.load(slot_ptr + grp * G).to(tl.int64)
    live = rok & ((hh * 0 + slot) >= 0)  # (broadcast first: the interpreter rejects scalar & tensor masks)
    unit = ((slot // P * HK + hh) * (P // G) + (slot % P) // G) * D + c  # [HB, DP] group index in the pages
    xb = x_ptr + (grp * G).to(tl.int64) * st + hh * sh + c * sd
    # pass 1: the NaN-propagating extremes over the group's tokens, on the GPU in x's own dtype (exact: every 16-bit
    # value is a float32 one; no conversion an element, and sm_90 takes three bf16 pairs an instruction); NATIVE 0
    # (the interpreter, whose bf16 maximum compares the bits as integers) in float32
    XT: tl.constexpr = x_ptr.dtype.element_ty if NATIVE else tl.float32
    mx = tl.full([HB, DP], float("-inf"), XT)
    mn = tl.full([HB, DP], float("inf"), XT)
    for t in tl.static_range(G):
        x = tl.load(xb + t * st, mask=rok, other=0.0).to(XT)
        mx = _nanmax(mx, x)
        mn = _nanmin(mn, x)
    mx = mx.to(tl.float32)
    mn = mn.to(tl.float32)
    mx = tl.where(mx != mx, float("nan"), mx)  # canonical NaN, as the oracle
    mn = tl.where(mn != mn, float("nan"), mn)
    m_raw = tl.zeros([HB, DP], tl.float32)
    if SYM:  # absmax: max |x| = max(|max x|, |min x|), NaN if any element is
        stat = _nanmax(tl.abs(mx), tl.abs(mn))
        bad = ~(stat < float("inf"))
    else:
        if tl.max((((mx == 0) | (mn == 0)) & rok).to(tl.int32)) > 0:  # rare: a zero extreme is the first zero (GGML)
            negz = tl.zeros([HB, DP], tl.int32)
            found = negz > 0
            for t in tl.static_range(G):
                xz = tl.load(xb + t * st, mask=rok, other=0.0).to(tl.float32)
                z = (xz == 0) & ~found
                negz = tl.where(z, (xz.to(tl.int32, bitcast=True) < 0).to(tl.int32), negz)
                found = found | z
            zero = _zero_signed(negz, mx)
            mx = tl.where(mx == 0, zero, mx)
            mn = tl.where(mn == 0, zero, mn)
        bad = ~((tl.abs(mx) < float("inf")) & (tl.abs(mn) < float("inf")))
        stat = mx - mn
        m_raw = mn
    s_raw, m_raw = _raw_scale(stat, m_raw, bad, ts_ptr, SDIV, False)  # a non-finite element: both NaN
    s_val, m_val, s_eff = _scales_out(s_raw, m_raw, scales_ptr, zeros_ptr, ts_ptr, unit, live, SYM, False, RULE, SDT,
                                      ELEM_INT, False)
    NB: tl.constexpr = G * W // 8  # bytes of a channel's group
    NW: tl.constexpr = NB // 4
    if PASS == 2:  # the fixup pass of a flagged program: IEEE division
        _emit(xb, rok, live, unit, codes_ptr, st, s_raw, s_val, m_raw, m_val, s_eff, cb_ptr, NW, W, NB, STR, FMT, SYM,
              RULE, RND, RECIP, OFF, QMAX, XORC, HW, WL, 2)
    else:
        exact = 0
        if RARE_PATHS and not RECIP and SAFE != 1:  # one check a program: a reciprocal out of Markstein's range
            # (an f16 scale's never is: `triton.quotient_safe`)
            exact = tl.max(tl.where(live, _odd(s_val, s_raw, s_val, m_raw, m_val, s_eff, cb_ptr, FMT, SYM, RECIP, OFF,
                                               0), 0))
        if PASS == 1:
            tl.store(flag_ptr + prog, exact)
            _emit(xb, rok, live, unit, codes_ptr, st, s_raw, s_val, m_raw, m_val, s_eff, cb_ptr, NW, W, NB, STR, FMT,
                  SYM, RULE, RND, RECIP, OFF, QMAX, XORC, HW, WL, 1)
        elif exact > 0:  # rare: the whole group by IEEE division
            _emit(xb, rok, live, unit, codes_ptr, st, s_raw, s_val, m_raw, m_val, s_eff, cb_ptr, NW, W, NB, STR, FMT,
                  SYM, RULE, RND, RECIP, OFF, QMAX, XORC, HW, WL, 2)
        else:
            _emit(xb, rok, live, unit, codes_ptr, st, s_raw, s_val, m_raw, m_val, s_eff, cb_ptr, NW, W, NB, STR, FMT,
                  SYM, RULE, RND, RECIP, OFF, QMAX, XORC, HW, WL, 1)


def why_not(spec, D: int) -> str | None:
    """None when this kernel stores `spec` (a kernel spec: rotation none) at head_dim D; else why not."""
    if spec.axis != "chan":
        return "not a channel-axis spec"
    if spec.fmt != "int" or spec.bits not in (2, 4, 8) or spec.calibrated:
        return f"{spec}: the token walk codes plain int specs of 2, 4 or 8 bits"
    if spec.static_scale or spec.tensor_scale or spec.rotation != "none" or spec.outliers:
        return f"{spec}: no static, tensor or calibrated scale, rotation or outlier slots in the token walk"
    if spec.rule not in ("absmax", "full") or (spec.rule == "full" and not spec.sym):
        return f"{spec}: the token walk takes absmax statistics (sym: max |x|, asym: min / max)"
    nbits = spec.group * spec.bits
    if nbits % 32 or nbits // 32 not in (1, 2, 4, 8):
        return f"{spec}: a group's packed bytes must be 1, 2, 4 or 8 words (G x bits = {nbits})"
    if D > 1024:
        return f"head_dim {D} > 1024"
    return None


def fits(pages: dict) -> bool:
    """The pages' codes start on a 4-byte boundary (the packed words are stored as int32)."""
    return pages["codes"].data_ptr() % 4 == 0


def launch_shape(Hk: int, D: int) -> tuple[int, int]:
    """(heads a program takes, its warps): up to 1024 padded channels a program, `LANE_ELEMS` of them a thread."""
    DP = next_pow2(D)
    HB = max(1, min(next_pow2(Hk), 1024 // DP))
    return HB, max(1, min(8, HB * DP // (32 * LANE_ELEMS)))


def run(x: torch.Tensor, pages: dict, slot_mapping: torch.Tensor, spec, page_size: int) -> None:
    """Launch the token walk: x [T, Hk, D] (T a multiple of the group), pages of `PageLayout(spec, D, page_size, Hk)`,
    slot_mapping [T] (whole groups of consecutive slots from a multiple of G; -1 skips a group), as `triton.run`
    takes them (checked by `api.store`)."""
    T, Hk, D = x.shape
    if T == 0:
        return
    p = kernel_params(spec, D)
    G = spec.group
    DP = next_pow2(D)
    HB, warps = launch_shape(Hk, D)
    codes, scales, zeros, dummy = kernel_pages(pages, x.device)
    grid = (T // G, triton.cdiv(Hk, HB))
    two = TWO_PASS and has_rare(p) and T >= TWO_PASS_MIN_TOKENS
    flags = torch.empty(grid[0] * grid[1], dtype=torch.int32, device=x.device) if two else dummy
    for pas in ((1, 2) if two else (0,)):
        _chan_walk_kernel[grid](
            x, codes, scales, zeros, slot_mapping.contiguous(), dummy, dummy, flags, *x.stride(),
            HK=Hk, HB=HB, D=D, DP=DP, P=page_size, G=G, W=spec.bits, STR=bool(p["ST0"]), FMT=p["FMT"], SYM=p["SYM"],
            RULE=p["RULE"], RND=p["RND"], RECIP=p["RECIP"], SDT=p["SDT"], SDIV=p["SDIV"], ELEM_INT=p["ELEM_INT"],
            OFF=p["OFF"], QMAX=p["QMAX"], XORC=p["XORC"], HW=_hw_fp8(x.device), NATIVE=not interpreting(),
            WL=bool(WORD_LOOP), SAFE=p["SAFE"], PASS=pas, num_warps=warps, enable_fp_fusion=False,
            **({} if MAXNREG is None or interpreting() else {"maxnreg": MAXNREG}))
