"""Gluon split-K decode that dequantizes KV codes straight into tensor-core (MMA) fragments.

Why this exists: the Triton kernel (`triton.py`) hands `tl.dot` a dequantized tile, and Triton
routes that tile through shared memory into the tensor-core operand layout; that round trip is what
held the 4-bit Triton decode far below its bytes' roofline (profiles in benchmarks/NOTES_decode.md).
Gluon lets a kernel name its register layouts,
so here every thread loads exactly the code bytes its `mma.sync.m16n8k16` fragments need and turns
them into fp16 fragment registers with a few integer / half2 instructions (`gluon_codecs.py`: int2 / 3 / 4 / 5 / 6 / 8,
fp8_e4m3, fp4 with e8m0 or e4m3 scales, 16-, 8- and 4-entry codebooks, KIVI's channel-axis keys; K and V may use different
codecs): no shared memory in the main loop. With splits, a separate merge kernel combines them, or (config
`fused_merge`) the last split program of each (sequence, KV head) does (one launch).

Work split: one program per (sequence, KV head, split) as in `triton.py`; its NW warps each own
TW (16 or 32) consecutive tokens of every NW * TW token tile and keep their own online softmax
state (a batched MMA: dim 0 of every tensor is the warp), merged across warps once at the end. Scores
are q K^T with the GQA group in the MMA's M = 16 rows; the output is accumulated as O^T = V^T P^T
(`_pv`, default) so that its N = 8 columns hold the heads (16 for groups over 8) instead of 16 mostly
padded rows. The next tile's code words are loaded before the current tile's math (a register
prefetch; config `prefetch`, off by default where two tiles of codes spill: `prefetches`). Splits are merged by
the Triton `tiles.attention.merge_kernel`. Measurements and the profile evidence behind this design:
benchmarks/NOTES_decode.md and sweeps/results/h200/README.md.

Head dims 64, 128 and 256 (D a constexpr: a thread owns D / 4 key channels, reading a scale per code word where they
span groups, and D / 8 value columns, which lie in one scale group except for fp4 values, which then read a scale
per code word too). Only on CUDA (sm_80+; fp8 sm_89+). There is no interpreter for Gluon: CPU tests run the kernel's
own source through `devtools/gluon_emu.py` and compile it for sm_90 offline (`devtools/sm90_offline.py`);
the GPU tests check it against the reference (tests/kernels/decode/test_gluon.py).

Backend contract (called by `api.py` only): `why_not(q, kv, config)`, `run(q, kv, sm_scale, config, out, plan)`.
"""
from __future__ import annotations

import functools
import math
import os

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as ttgl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from ...quant.formats import codebook16
from ...quant.rotation import hadamard, hadamard_block, hadamard_signs, norm_constant
from ..configs import GluonDecodeConfig
from ..paged import PagedKV
from ..tiles.operands import LOG2E, fused_unrotation, merge_splits, merge_with_fp
from .gluon_codecs import (
    ASM_UNPACK,
    C_KF2,
    C_KF4,
    C_Q4G,
    CB,
    CHAN,
    CHAN_TW,
    CODECS,
    F4,
    F8,
    HEAD_DIMS,
    KC2,
    KC3,
    KC4,
    KF2,
    KF4,
    KT3,
    KT4,
    NIBP,
    PER_WORD,
    Q4,
    Q4A,
    Q4G,
    TABLES,
    V_PER_WORD,
    cb_table_words,
    codec_of,
    k_build,
    k_channel_order,
    k_load,
    kc_build,
    kc_load,
    scale_code,
    tile_tok,
    v_build,
    v_channel_order,
    v_load,
    wide,
    words_k,
    words_v,
)

# Compute capabilities on which the GPU tests (tests/kernels/decode/test_gluon.py) have passed; the
# result files under sweeps/results/ name the GPU and versions. The tuner offers this kernel only on these
# (it times candidates, it does not check their results); a config with kernel "gluon" runs it on request
# anywhere `why_not` allows, and KVLAB_GLUON=1 lets the tuner offer it on other GPUs too.
GPU_VERIFIED: tuple[tuple[int, int], ...] = ((9, 0),)
# codecs whose GPU tests have not run yet (a new codec, checked on CPU only: the emulated kernel against the reference,
# the asm value by value, the sm_90 offline compile): default dispatch and the tuner leave them to the Triton kernels;
# an explicit config with kernel "gluon" runs them (a tuned entry that names the Gluon kernel for them is refused too).
# Empty now: session 34's int5 / int6 codecs (`NIBP`) were here until their GPU tests passed on an H100 (sm_90, as the
# H200; `bash benchmarks/h200_run.sh s34`, sweeps/results/h100/runs/s34-6c13e71/pytest_np.log)
GPU_UNTESTED: tuple[int, ...] = ()
# codecs whose groups of 16 (a scale per code word for keys, and for values at head_dim 256) have not passed the GPU
# tests (int4 and the 16-entry codebooks were here until the same run; fp4's passed before)
GPU_UNTESTED_G16: tuple[int, ...] = ()


def untested(k_spec=None, v_spec=None) -> str | None:
    """Why a call of these specs stays off the default path (a side's codec in GPU_UNTESTED, or in GPU_UNTESTED_G16
    at groups of 16), or None."""
    for name, spec, role in (("K", k_spec, "k"), ("V", v_spec, "v")):
        c = None if spec is None else codec_of(spec, role)
        if c is not None and (c in GPU_UNTESTED or (c in GPU_UNTESTED_G16 and _group(spec) == 16)):
            return (f"{name} spec {spec}: its Gluon codec has not passed the GPU tests yet (gluon.GPU_UNTESTED); "
                    f"the default dispatch leaves it to the Triton kernels, an explicit config with kernel 'gluon' runs it")
    return None


def gpu_verified(device, k_spec=None, v_spec=None) -> bool:
    """True when `device` is a CUDA GPU of a compute capability in GPU_VERIFIED (and neither given spec's codec is in
    GPU_UNTESTED: `untested`)."""
    if untested(k_spec, v_spec) is not None:
        return False
    dev = torch.device(device)
    return dev.type == "cuda" and torch.cuda.is_available() and \
        tuple(torch.cuda.get_device_capability(dev)) in GPU_VERIFIED


# the scores transposed (S^T = K Q^T, `_scores_t`) where a config leaves `scores_t` None (KVLAB_GLUON_SCORES_T=0
# turns it off): on the H200 at B 32 x 32K, q4_0 0.444 -> 0.399 ms, kivi4 0.603 -> 0.556, q4_1 0.471 -> 0.441, most
# other schemes 1-4% faster, fp8 equal; int2 +2% and int4_had +9% (their packaged B 32 entries keep scores_t False);
# at B 1 x 32K 0-8% faster (sweeps/results/h200/runs/s26-9c1f792)
SCORES_T = os.environ.get("KVLAB_GLUON_SCORES_T", "1") not in ("", "0")
# the rolled loop's whole tiles loaded and scored without masks, the partial last tile with them (kernel constexpr
# FT; KVLAB_GLUON_FULL_TILES=0 masks every tile as before; session 27, untimed)
FULL_TILES = os.environ.get("KVLAB_GLUON_FULL_TILES", "1") not in ("", "0")
# KIVI's int4 / int2 keys with their scales and zeros folded into the query and the scores (`gluon_codecs.C_KF4`,
# `C_KF2`, `_scores_tf`): the codes enter the MMA from one AND, as fp16 subnormals (offline sm_90: see
# benchmarks/NOTES_decode.md session 28). On by default since its GPU tests (the tensor cores' subnormal inputs)
# passed on an sm_90 GPU (an H100, session 29) and it timed kivi2 0.468 -> 0.398 ms, kivi4 0.508 -> 0.503 at B 32 x
# 32K there (sweeps/results/h100/runs/s29-eb24031); KVLAB_GLUON_KIVI_FOLD=0 turns it off
KIVI_FOLD = os.environ.get("KVLAB_GLUON_KIVI_FOLD", "1") not in ("", "0")
# q4_0 keys read by scale groups (`gluon_codecs.C_Q4G`, `_scores_tg`): with the transposed scores, the codes enter
# the MMA straight from one LOP3 and the group scales and offsets apply to each group's partial scores (offline sm_90,
# loop instructions a 16-token tile without the register prefetch: 367 -> 349 at 128 registers, 359 -> 334 at 168;
# benchmarks/NOTES_decode.md, session 28); KVLAB_GLUON_GROUPED_K=1 turns it on (off: 8-13% slower at q4_0's B 32
# configs on an H100, session 29, though its GPU tests pass)
GROUPED_K = os.environ.get("KVLAB_GLUON_GROUPED_K", "0") not in ("", "0")
# the transposed scores' lazy rescale (kernel constexpr ST 2, `_online_t`, `_rescale`): a warp keeps its running max
# until some head's grows by more than 2^LAZY_TAU, and skips the accumulator's rescale (D / 4 FMUL a thread: 32 of
# q4_0's 370 loop instructions a 16-token tile) on a branch when none of its heads moved; exact up to rounding, as
# the sums and the merge use the same stale max (session 29: GPU tests pass on an H100; there it moved B 32 times by
# -3% to +4.5%, so it stays off); KVLAB_GLUON_LAZY_RESCALE=1 turns it on
LAZY_RESCALE = os.environ.get("KVLAB_GLUON_LAZY_RESCALE", "0") not in ("", "0")
LAZY_TAU = ttgl.constexpr(8.0)  # log2 units: a tile's probabilities stay below 2^8 (fp16 P, fp32 sums: room to spare)


def rescale_asm(n: int) -> str:
    """PTX for `_rescale`, n elements a pack: $0.. the results, $n.. the accumulator (tied to the results' registers by
    the constraints "0".."n-1", `RESCALE_C16` / `RESCALE_C32`, so skipping leaves it as it was, with no copies),
    $2n.. alpha, $3n.. the warp's flag (the first of its n copies decides): the products only when the flag is set.
    The label is local to the braces, so the block may be inlined many times. Tagged for the CPU emulator
    (devtools.gluon_emu)."""
    body = [f"mul.f32 ${i}, ${n + i}, ${2 * n + i};" for i in range(n)]
    return "\n".join(["{ // kvlab:rescale", ".reg .pred p;", f"setp.eq.s32 p, ${3 * n}, 0;", "@p bra.uni SKIP;"]
                      + body + ["SKIP:", "}"])


# the warp's flag for `_rescale`: whether any lane's alpha (both of its heads, pack 2) differs from 1 (vote.any)
ASM_WARP_ANY = ttgl.constexpr("{ // kvlab:warp-any\n.reg .pred p, q;\nsetp.neu.f32 p, $2, 0f3F800000;\n"
                              "setp.neu.or.f32 p, $3, 0f3F800000, p;\nvote.sync.any.pred q, p, 0xffffffff;\n"
                              "selp.b32 $0, 1, 0, q;\nmov.b32 $1, $0;\n}")
ASM_RESCALE16 = ttgl.constexpr(rescale_asm(16))
ASM_RESCALE32 = ttgl.constexpr(rescale_asm(32))
RESCALE_C16 = ttgl.constexpr(",".join(["=f"] * 16 + [str(i) for i in range(16)] + ["f"] * 16 + ["r"] * 16))
RESCALE_C32 = ttgl.constexpr(",".join(["=f"] * 32 + [str(i) for i in range(32)] + ["f"] * 32 + ["r"] * 32))
PAGE_UNIT = 16  # page sizes must be multiples of this; tokens per warp per tile TW is 16 or 32 (config)
GP = ttgl.constexpr(16)  # MMA rows: the GQA group, padded


def _group(spec) -> int:
    """Channels per scale group (32 for codecs without group scales: never used)."""
    return spec.group if spec.group in (16, 32, 64, 128) else 32


@functools.lru_cache(maxsize=32)
def channel_orders(kcodec: int, kpack: str, kg: int, vcodec: int, vpack: str, vg: int, device,
                   D: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """(k_channel_order, v_channel_order) at head dim D as int32 tensors on `device` (the kernel's KPERM / VPERM)."""
    return (torch.tensor(k_channel_order(kcodec, kpack, kg, D), dtype=torch.int32, device=device),
            torch.tensor(v_channel_order(vcodec, vpack, vg, D), dtype=torch.int32, device=device))


HAS_BARRIER = ttgl.constexpr(hasattr(ttgl, "barrier"))
_COUNTERS: dict = {}


def counters(device, n: int) -> torch.Tensor:
    """int32 [>= n] zeros for the fused split merge, one buffer per (device, current stream): the kernel's last
    program of each (sequence, KV head) resets its counter, so the buffer stays zero between calls and under
    CUDA-graph replay. Allocated outside any launch (a plan allocates it when it is made)."""
    dev = torch.device(device)
    key = (dev, torch.cuda.current_stream(dev).cuda_stream if dev.type == "cuda" else 0)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        buf = _COUNTERS[key] = torch.zeros(max(n, 1024), dtype=torch.int32, device=dev)
    return buf


@functools.lru_cache(maxsize=32)
def tables(k_fmt: str | None, v_fmt: str | None, device) -> torch.Tensor:
    """int32 [16]: the K and V codebooks' table words (`cb_table_words`; zeros where a side has no codebook)."""
    words = [cb_table_words(codebook16(f)) if f else [0] * 8 for f in (k_fmt, v_fmt)]
    return torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words[0] + words[1]], dtype=torch.int32,
                        device=device)


@functools.lru_cache(maxsize=8)
def _byte_shifts(device) -> torch.Tensor:
    """int64 [4] (0, 8, 16, 24) on `device`, made once outside any CUDA graph capture (a host-to-device copy is
    refused while one is captured)."""
    return torch.tensor([0, 8, 16, 24], dtype=torch.int64, device=device)


def table_words_of(table: torch.Tensor, sh: torch.Tensor | None = None) -> torch.Tensor:
    """int32 [8]: `cb_table_words` of a float32 [16] table on its device (a calibrated codebook's pages["codebook"]),
    with tensor ops only: no host sync, so a CUDA graph replays it and reads the table as it is then. sh:
    `_byte_shifts(table.device)`, passed in by a caller that may run under graph capture."""
    h = table.to(torch.float16).view(torch.int16).to(torch.int64) & 0xFFFF
    lo, hi = (h & 0xFF).view(4, 4), (h >> 8).view(4, 4)
    sh = _byte_shifts(table.device) if sh is None else sh
    w = torch.cat([(lo << sh).sum(1), (hi << sh).sum(1)])
    return torch.where(w >= 1 << 31, w - (1 << 32), w).to(torch.int32)


def _bits(n: int) -> list[int]:
    return [1 << i for i in range(n.bit_length() - 1)]


@functools.lru_cache(maxsize=32)
def layouts(NW: int, TW: int = 16, WK: int = 4, WV: int = 2, D: int = 128) -> dict:
    """Register layouts (constexpr) for NW warps of TW tokens each, WK / WV code words per thread per K / V
    row at head dim D: MMA accumulator, dot operands, code words (KCL: channel-axis keys' [NW, D / 8, r, g])."""
    if TW not in (16, 32):
        raise ValueError(f"tokens per warp must be 16 or 32, got {TW}")
    mma = ttgl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[NW, 1, 1], instr_shape=[1, 16, 8])
    warps = [[b, 0, 0, 0] for b in _bits(NW)]
    hi_tok = [[0, 0, 0, 16]] if TW == 32 else []  # token bit 4 in registers
    # K words [NW, wi WK, r 4, TW]: wi in registers, r = lane % 4, token = lane // 4 (+ 8, + 16 in registers)
    kw = ttgl.DistributedLinearLayout(
        reg_bases=[[0, b, 0, 0] for b in _bits(WK)] + [[0, 0, 0, 8]] + hi_tok,
        lane_bases=[[0, 0, 1, 0], [0, 0, 2, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 4]],
        warp_bases=warps, block_bases=[], shape=[NW, WK, 4, TW])
    # V words [NW, we WV, g 8, TW]: we and token bits 0, 3 (, 4) in registers, token bits 1-2 = lane % 4, g = lane // 4
    vw = ttgl.DistributedLinearLayout(
        reg_bases=[[0, b, 0, 0] for b in _bits(WV)] + [[0, 0, 0, 1], [0, 0, 0, 8]] + hi_tok,
        lane_bases=[[0, 0, 0, 2], [0, 0, 0, 4], [0, 0, 1, 0], [0, 0, 2, 0], [0, 0, 4, 0]],
        warp_bases=warps, block_bases=[], shape=[NW, WV, 8, TW])
    # V words of the first / second token of each fragment pair [NW, we WV, g 8, c TW/2] (c = token pair)
    vwa = ttgl.DistributedLinearLayout(
        reg_bases=[[0, b, 0, 0] for b in _bits(WV)] + [[0, 0, 0, 4]] + ([[0, 0, 0, 8]] if TW == 32 else []),
        lane_bases=[[0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 1, 0], [0, 0, 2, 0], [0, 0, 4, 0]],
        warp_bases=warps, block_bases=[], shape=[NW, WV, 8, TW // 2])
    # channel-axis key units [NW, x D / 8, r 4, g 8]: x in registers, r = lane % 4, g = lane // 4
    kcl = ttgl.DistributedLinearLayout(
        reg_bases=[[0, b, 0, 0] for b in _bits(D // 8)],
        lane_bases=[[0, 0, 1, 0], [0, 0, 2, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 4]],
        warp_bases=warps, block_bases=[], shape=[NW, D // 8, 4, 8])
    # scores [NW, 8, TW] of the first 8 MMA rows: the accumulator's registers without its row-8 bit
    s8 = ttgl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1], [0, 0, 8]] + ([[0, 0, 16]] if TW == 32 else []),
        lane_bases=[[0, 0, 2], [0, 0, 4], [0, 1, 0], [0, 2, 0], [0, 4, 0]],
        warp_bases=[[b, 0, 0] for b in _bits(NW)], block_bases=[], shape=[NW, 8, TW])
    # the fused merge's [GPN, D] partials: a warp per head row, D / 32 contiguous channels per lane (D >= 64)
    ml = ttgl.BlockedLayout(size_per_thread=[1, max(1, D // 32)], threads_per_warp=[1, 32], warps_per_cta=[NW, 1],
                            order=[1, 0])
    # keys by groups (`C_Q4G`): scales [NW, TW, D / 32], the scores' rows (lane // 4, + 8, + 16 in registers) with
    # every group in a thread's registers (lane % 4 holds copies)
    kx = ttgl.BlockedLayout(size_per_thread=[1, 1, max(1, D // 32)], threads_per_warp=[1, 8, 4],
                            warps_per_cta=[NW, 1, 1], order=[2, 1, 0])
    return dict(KX=kx, S8=s8, ML=ml, KCL=kcl, VWA=vwa, MMA=mma,
                A=ttgl.DotOperandLayout(operand_index=0, parent=mma, k_width=2),
                B=ttgl.DotOperandLayout(operand_index=1, parent=mma, k_width=2), KW=kw, VW=vw)


def _prefetch_layout(NW: int, NLP: int):
    """[NW, NLP] prefetch lines: a warp a row, NLP / 32 consecutive lines a lane."""
    return ttgl.BlockedLayout(size_per_thread=[1, NLP // 32], threads_per_warp=[1, 32], warps_per_cta=[NW, 1],
                              order=[1, 0])


# one L2 line prefetch a lane where $2 != 0 (`_l2_issue`); the result is a dummy, the asm is kept (not pure)
PF_ASM = ttgl.constexpr("{ .reg .pred p; setp.ne.u32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }")
L2_LINE = 128
LINE = ttgl.constexpr(L2_LINE)


@gluon.jit
def _l2_take(lane, acc, X, xs0, xs1, hk, C: ttgl.constexpr, N: ttgl.constexpr, NPW: ttgl.constexpr,
             PB: ttgl.constexpr, UB: ttgl.constexpr, SH: ttgl.constexpr, ES: ttgl.constexpr, PS: ttgl.constexpr):
    """acc = (base, page stride, unit bytes, unit shift, page part) of each prefetch line [NLP]; lines C ..
    C + NPW N take tensor X's: N lines a page part of PB bytes (units of UB bytes, 2^SH tokens; element bytes ES,
    strides xs0 (pages, in PS elements) and xs1 (heads)), base = X's (page 0, head hk) tile + the line's offset
    (the last line clamped to the part's last byte: a part that may start off a line has one line more)."""
    base, pstr, unit, shift, pj = acc
    if N > 0:
        rel = lane - C
        inr = (rel >= 0) & (rel < NPW * N)
        part = rel // N
        off = ttgl.minimum((rel - part * N) * LINE, PB - 1)
        xb = X.to(ttgl.int64, bitcast=True) + hk.to(ttgl.int64) * (xs1 * ES)
        base = ttgl.where(inr, xb + off.to(ttgl.int64), base)
        pstr = ttgl.where(inr, xs0 * (PS * ES), pstr)
        unit = ttgl.where(inr, UB, unit)
        shift = ttgl.where(inr, SH, shift)
        pj = ttgl.where(inr, part, pj)
    return base, pstr, unit, shift, pj


@gluon.jit
def _l2_pages(IDX, tp, hi, pj, P: ttgl.constexpr, TW: ttgl.constexpr, NW: ttgl.constexpr, PFL: ttgl.constexpr):
    """[NW, NLP] page of each prefetch line of the tile from token tp: warp w's tokens tp + w TW .., page part pj of
    them (pj > 0 where a warp's tokens span pages); 0 where that part starts at or past `hi` (not prefetched)."""
    tb = tp + ttgl.arange(0, NW, layout=ttgl.SliceLayout(1, PFL)) * TW
    tj = tb[:, None] + (pj * P)[None, :]  # first token of the line's page part
    return ttgl.load(IDX + (tb // P)[:, None] + pj[None, :], mask=tj < hi, other=0)


@gluon.jit
def _l2_issue(tp, hi, pg, lines, lane, NL: ttgl.constexpr, P: ttgl.constexpr, TW: ttgl.constexpr,
              NW: ttgl.constexpr, PFL: ttgl.constexpr):
    """Prefetch into L2 the lines the tile from token tp will read, a line a lane (`_l2_take` laid them out, NL of
    them): the line's base + its page (pg, `_l2_pages`) x page stride + the warp's first unit x unit bytes. Parts at
    or past `hi` and lanes past NL are skipped."""
    base, pstr, unit, shift, pj = lines
    tb = tp + ttgl.arange(0, NW, layout=ttgl.SliceLayout(1, PFL)) * TW
    if P >= TW:
        r0 = tb % P  # first row of the warp's tokens in its page (P % TW == 0: they stay in it)
    else:
        r0 = tb * 0  # whole pages
    rel = (r0[:, None] >> shift[None, :]) * unit[None, :]  # bytes from the tile's start
    addr = base[None, :] + wide(pg, pg * 0 + pstr[None, :]) + rel.to(ttgl.int64)
    go = (lane < NL)[None, :] & ((tb[:, None] + (pj * P)[None, :]) < hi)
    ttgl.inline_asm_elementwise(PF_ASM, "=r,l,r", [addr, go.to(ttgl.int32)], dtype=ttgl.int32, is_pure=False,
                                pack=1)


@gluon.jit
def _l2_step(IDX, t, hi, pg, lines, lane, AHEAD: ttgl.constexpr, BN: ttgl.constexpr, NL: ttgl.constexpr,
             P: ttgl.constexpr, TW: ttgl.constexpr, NW: ttgl.constexpr, PFL: ttgl.constexpr):
    """One L2 prefetch step beside the tile from token t: issue the lines of the tile AHEAD tiles on (its pages pg,
    looked up a step before) -> the pages of the tile after that."""
    _l2_issue(t + AHEAD * BN, hi, pg, lines, lane, NL, P, TW, NW, PFL)
    return _l2_pages(IDX, t + (AHEAD + 1) * BN, hi, lines[4], P, TW, NW, PFL)


@gluon.jit
def _scores(q, kt, valid, m_i, l_i, MMA: ttgl.constexpr, GP: ttgl.constexpr, TW: ttgl.constexpr,
            NW: ttgl.constexpr, ROWS: ttgl.constexpr, SR: ttgl.constexpr, MASK: ttgl.constexpr = True):
    """One online-softmax step of every warp: scores q K^T [NW, GP, TW] (log2 domain; columns not `valid` are
    -inf), of which the first ROWS rows (GP, or GPN = 8 when the accumulator is O^T; layout SR) -> (p [NW, ROWS,
    TW], new max, new sum, alpha = the factor that rescales the accumulator). MASK False: every column is valid."""
    s = mma_v2(q, kt, ttgl.zeros([NW, GP, TW], ttgl.float32, layout=MMA))
    if MASK:
        s = ttgl.where(valid[:, None, :], s, float("-inf"))
    if ROWS < GP:  # the padded rows GPN.. of the MMA carry no head: drop them before the softmax (a register choice)
        s = ttgl.convert_layout(_heads(s, ROWS, NW), SR, assert_trivial=True)
    m_new = ttgl.maximum(m_i, ttgl.max(s, 2))
    m_safe = ttgl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing seen yet stay at 0, not NaN
    alpha = ttgl.exp2(m_i - m_safe)
    p = ttgl.exp2(s - m_safe[:, :, None])
    return p, m_new, l_i * alpha + ttgl.sum(p, 2), alpha


@gluon.jit
def _heads(x, GPN: ttgl.constexpr, NW: ttgl.constexpr):
    """x [NW, GP, ...] (rows = padded heads, MMA row layout) -> its first GPN rows (GPN 8: row bit 3 lives in
    registers, so this is a register selection)."""
    if GPN == 8:
        if len(x.shape) == 2:
            x = ttgl.split(ttgl.permute(ttgl.reshape(x, [NW, 2, 8]), [0, 2, 1]))[0]
        else:
            x = ttgl.split(ttgl.permute(ttgl.reshape(x, [NW, 2, 8, x.shape[2]]), [0, 2, 3, 1]))[0]
    return x


@gluon.jit
def _pv(p, vt, acc, alpha, OT: ttgl.constexpr, A: ttgl.constexpr, B: ttgl.constexpr, MMA: ttgl.constexpr,
        GPN: ttgl.constexpr, NW: ttgl.constexpr):
    """acc * alpha + P V for every warp. p fp32 (`_scores`' rows and layout), vt [NW, TW, D] fp16 (B fragment).
    OT: acc is O^T [NW, D, GPN]: V^T is the A operand (the same registers as vt, reordered) and P^T [NW, TW, GPN]
    the B operand (p's registers), so the accumulator holds GPN heads, not 16 padded rows; alpha moves to the
    accumulator's column layout (a warp-local exchange). Else p is [NW, GP, TW] and acc is O [NW, GP, D]."""
    if OT:
        pt = ttgl.convert_layout(ttgl.permute(p.to(ttgl.float16), [0, 2, 1]), B, assert_trivial=True)
        va = ttgl.convert_layout(ttgl.permute(vt, [0, 2, 1]), A, assert_trivial=True)
        al = ttgl.convert_layout(alpha, ttgl.SliceLayout(1, MMA))
        return mma_v2(va, pt, acc * al[:, None, :])
    else:
        return mma_v2(ttgl.convert_layout(p.to(ttgl.float16), A, assert_trivial=True), vt, acc * alpha[:, :, None])


@gluon.jit
def _scores_t(qt, kt, MMA: ttgl.constexpr, A: ttgl.constexpr):
    """`_scores` with the scores transposed: S^T = K Q^T [NW, TW, GPN] (tokens in the MMA's M rows, the 8 heads in
    its N columns), so a tile of 16 tokens takes D / 16 MMAs instead of 2 D / 16 with 16 padded head rows. kt [NW,
    D, TW] (B fragment) is the A fragment of K [NW, TW, D] in the same registers; qt: Q^T [NW, D, GPN] (B fragment).
    -> S^T [NW, TW, GPN] fp32 (MMA layout), for `_online_t`."""
    ka = ttgl.convert_layout(ttgl.permute(kt, [0, 2, 1]), A, assert_trivial=True)
    return mma_v2(ka, qt, ttgl.zeros([kt.shape[0], kt.shape[2], qt.shape[2]], ttgl.float32, layout=MMA))


@gluon.jit
def _online_t(s, valid, m_i, l_i, MASK: ttgl.constexpr, LZ: ttgl.constexpr = False):
    """The online-softmax step on transposed scores s [NW, TW, GPN]: valid [NW, TW]; m_i [NW, GPN] (SliceLayout(1,
    MMA): alpha already in O^T's column layout); l_i [NW, TW, GPN]: each score's own running sum (the kernel sums
    over the tokens once, after the loop, instead of a three-level lane exchange a tile) -> (p^T [NW, TW, GPN], new
    max, new sums, alpha). LZ: a head's max moves only when it grows by more than 2^LAZY_TAU, so alpha is exactly 1
    for the heads that keep theirs (`_rescale` then skips the warp's accumulator when all do)."""
    if MASK:
        s = ttgl.where(valid[:, :, None], s, float("-inf"))
    m_new = ttgl.maximum(m_i, ttgl.max(s, 1))
    if LZ:  # (-inf + tau is -inf: a head's first scores always move its max)
        m_new = ttgl.where(m_new > m_i + LAZY_TAU, m_new, m_i)
    m_safe = ttgl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing seen yet stay at 0, not NaN
    alpha = ttgl.exp2(m_i - m_safe)
    p = ttgl.exp2(s - m_safe[:, None, :])
    return p, m_new, l_i * alpha[:, None, :] + p, alpha


@gluon.jit
def _by_group(x, NG: ttgl.constexpr):
    """x [NW, NG * R, C] (groups of R rows: the top bits of the row index lie in registers) -> [NW, R, C, 2, ..]
    with the group index in the trailing size-2 dims (the last is its bit 0), so `_group_of` picks a group out by
    register renames."""
    R: ttgl.constexpr = x.shape[1] // NG
    y = ttgl.permute(ttgl.reshape(x, [x.shape[0], NG, R, x.shape[2]]), [0, 2, 3, 1])
    if NG == 2:
        return y
    elif NG == 4:
        return ttgl.reshape(y, [x.shape[0], R, x.shape[2], 2, 2])
    else:
        return ttgl.reshape(y, [x.shape[0], R, x.shape[2], 2, 2, 2])


@gluon.jit
def _group_of(y, g: ttgl.constexpr, NB: ttgl.constexpr):
    """Group g of `_by_group`'s (or a [.., 2, ..] scale tensor's) trailing NB size-2 dims."""
    for i in ttgl.static_range(NB):
        y = ttgl.split(y)[(g >> i) & 1]
    return y


@gluon.jit
def _pairs_b(w, B: ttgl.constexpr):
    """Channel-axis scale or zero pairs w [NW, D / 8, r, g] (packed f16x2 words, `kc_load`'s layout) -> [NW, D, 8] fp16
    in the B fragment's layout, row kappa = 8 x + 2 r + h2 (`k_channel_order`), every column the same: the thread of
    lane 4 g + r holds the pairs its fragment needs."""
    lo, hi = ttgl.inline_asm_elementwise(ASM_UNPACK, "=h,=h,r", [w], dtype=(ttgl.float16, ttgl.float16), is_pure=True,
                                         pack=1)
    x = ttgl.permute(ttgl.join(lo, hi), [0, 1, 2, 4, 3])  # [NW, X, r, h2, g]
    return ttgl.convert_layout(ttgl.reshape(x, [w.shape[0], 8 * w.shape[1], w.shape[3]]), B, assert_trivial=True)


@gluon.jit
def _scores_tf(qt, kt, ks, kz, MMA: ttgl.constexpr, A: ttgl.constexpr, B: ttgl.constexpr, ODD: ttgl.constexpr):
    """`_scores_t` for KIVI's keys folded (`C_KF4`, `C_KF2`): kt [NW, D, TW] holds the codes as fp16 subnormals (n 2^-24
    at even tokens, ODD n 2^-24 at odd ones: 16 for int4's high nibbles, 4 for int2's odd fields; `asm_kf`, `AKF2`),
    ks / kz the warp's channel scale and zero pairs (`kc_load`), one pair per channel within the tile. S^T = K' (Q s)^T
    x 2^24 (2^24 / ODD at odd tokens) + 1 (Q m)^T, 1 all ones: two HMUL2 a query register, one MMA chain of ones by
    Q m, one FFMA a score."""
    NW: ttgl.constexpr = kt.shape[0]
    TW: ttgl.constexpr = kt.shape[2]
    GPN: ttgl.constexpr = qt.shape[2]
    D: ttgl.constexpr = qt.shape[1]
    qs = qt * _pairs_b(ks, B)
    ka = ttgl.convert_layout(ttgl.permute(kt, [0, 2, 1]), A, assert_trivial=True)
    s = mma_v2(ka, qs, ttgl.zeros([NW, TW, GPN], ttgl.float32, layout=MMA))
    # sum_c m_c q_c [h] in every row: ones (A, one register quad for every slice) by q m (B: the products rounded to
    # fp16 as the per-element path rounds s n + m)
    mz = mma_v2(ttgl.full([NW, TW, D], 1.0, ttgl.float16, layout=A), qt * _pairs_b(kz, B),
                ttgl.zeros([NW, TW, GPN], ttgl.float32, layout=MMA))
    n = ttgl.arange(0, TW, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(2, MMA)))
    fac = ttgl.where(tile_tok(n, TW, True) % 2 == 1, 16777216.0 / ODD, 16777216.0)  # 2^24 / ODD, 2^24
    return s * fac[None, :, None] + mz


@gluon.jit
def _hi_lo(x):
    """fp32 x -> [.., 2] fp16: its high part and the rest (x to about 2^-22 relative)."""
    h = x.to(ttgl.float16)
    return ttgl.join(h, (x - h.to(ttgl.float32)).to(ttgl.float16))


@gluon.jit
def _pad_rows(x):
    """[NW, R, C] -> [NW, 2 R, C], rows R.. zero."""
    y = ttgl.permute(ttgl.join(x, ttgl.zeros_like(x)), [0, 3, 1, 2])
    return ttgl.reshape(y, [x.shape[0], 2 * x.shape[1], x.shape[2]])


@gluon.jit
def _scores_tg(qt, bc, kt, ks, ka, MMA: ttgl.constexpr, A: ttgl.constexpr, B: ttgl.constexpr, D: ttgl.constexpr):
    """`_scores_t` for keys by groups (`C_Q4G`): kt [NW, D, TW] holds the codes as 1024 + n (1024 + 16 n at the high
    nibbles, whose entries of qt are divided by 16), so S^T = sum over the D / 32 groups g of scale_g [t] (K_g Q_g^T)
    [t, h] - sum_g scale_g [t] C_g [h], C_g the group's query sum times the offsets (`_decode_mma_kernel`). The offset
    term is one MMA: ka [NW, TW, 16] (the scales, each group's twice) by bc [NW, 16, GPN] (each C_g's fp16 high and
    low parts, negated); each group's partial scores then take their fp32 scale from ks [NW, TW, D / 32]."""
    NG: ttgl.constexpr = D // 32
    NB: ttgl.constexpr = 1 if NG == 2 else (2 if NG == 4 else 3)
    NW: ttgl.constexpr = kt.shape[0]
    TW: ttgl.constexpr = kt.shape[2]
    GPN: ttgl.constexpr = qt.shape[2]
    s = mma_v2(ka, bc, ttgl.zeros([NW, TW, GPN], ttgl.float32, layout=MMA))
    k5 = _by_group(kt, NG)  # [NW, 32, TW, 2..]
    q5 = _by_group(qt, NG)  # [NW, 32, GPN, 2..]
    if NG == 2:
        s5 = ks
    elif NG == 4:
        s5 = ttgl.reshape(ks, [NW, TW, 2, 2])
    else:
        s5 = ttgl.reshape(ks, [NW, TW, 2, 2, 2])
    for g in ttgl.static_range(NG):
        kg = ttgl.convert_layout(ttgl.permute(_group_of(k5, g, NB), [0, 2, 1]), A, assert_trivial=True)
        qg = ttgl.convert_layout(_group_of(q5, g, NB), B, assert_trivial=True)
        sg = mma_v2(kg, qg, ttgl.zeros([NW, TW, GPN], ttgl.float32, layout=MMA))
        dg = ttgl.convert_layout(_group_of(s5, g, NB), ttgl.SliceLayout(2, MMA), assert_trivial=True)
        s = s + sg * dg.to(ttgl.float32)[:, :, None]
    return s


@gluon.jit
def _pv_t(pt, vt, acc, alpha, A: ttgl.constexpr, B: ttgl.constexpr, RESCALE: ttgl.constexpr = True):
    """O^T * alpha + V^T P^T with P^T from `_scores_t` ([NW, TW, GPN], the MMA's accumulator layout: its tokens
    move from the lanes' row bits to their column bits, the B fragment's). RESCALE False: acc is already rescaled
    (`_rescale`)."""
    pb = ttgl.convert_layout(pt.to(ttgl.float16), B)
    va = ttgl.convert_layout(ttgl.permute(vt, [0, 2, 1]), A, assert_trivial=True)
    if RESCALE:
        acc = acc * alpha[:, None, :]
    return mma_v2(va, pb, acc)


@gluon.jit
def _rescale(acc, alpha):
    """acc [NW, D, GPN] (O^T) times alpha [NW, GPN] (SliceLayout(1, MMA)), skipped by a branch in each warp whose
    alphas are all exactly 1 (`_online_t` with LZ). The warp's flag is a vote over its lanes, each of which holds two
    of the 8 heads' alphas (the m16n8 accumulator's column pair), so it is the same in all of them and the branch is
    uniform (`rescale_asm`); D / 4 elements a thread, in packs of 32."""
    need = ttgl.inline_asm_elementwise(ASM_WARP_ANY, "=r,=r,f,f", [alpha], dtype=ttgl.int32, is_pure=True,
                                       pack=2)[:, None, :]
    if acc.shape[1] >= 128:
        return ttgl.inline_asm_elementwise(ASM_RESCALE32, RESCALE_C32, [acc, alpha[:, None, :], need],
                                           dtype=ttgl.float32, is_pure=True, pack=32)
    else:
        return ttgl.inline_asm_elementwise(ASM_RESCALE16, RESCALE_C16, [acc, alpha[:, None, :], need],
                                           dtype=ttgl.float32, is_pure=True, pack=16)


@gluon.jit
def _merge_last(OP, LSE, OUT, CNT, b, hk, num_splits, so0, so1, GROUP: ttgl.constexpr, GPN: ttgl.constexpr,
                D: ttgl.constexpr, ML: ttgl.constexpr):
    """After this program's partial and log2-sum-exp are stored: count it in CNT[b, hk]; the last of the
    num_splits programs of (b, hk) merges all of them into OUT (as `merge_splits`) and resets the count, so the
    counters are zero between calls (graph replays included). The barrier orders every thread's stores before
    the count (acq_rel, gpu scope); the merge reads past L1 (.cg)."""
    if HAS_BARRIER:  # (Triton 3.9's Gluon; older ones name it thread_barrier)
        ttgl.barrier()
    else:
        ttgl.thread_barrier()
    cidx = b * ttgl.num_programs(1) + hk
    seen = ttgl.atomic_add(CNT + cidx, 1, sem="acq_rel", scope="gpu")
    if seen == num_splits - 1:
        rows = ttgl.arange(0, GPN, layout=ttgl.SliceLayout(1, ML))
        d = ttgl.arange(0, D, layout=ttgl.SliceLayout(0, ML))
        hm = rows < GROUP
        base = (b * ttgl.num_programs(1) * GROUP + hk * GROUP + rows) * num_splits  # [GPN] first split of each head
        m = ttgl.full([GPN], float("-inf"), ttgl.float32, layout=ttgl.SliceLayout(1, ML))
        tot = ttgl.zeros([GPN], ttgl.float32, layout=ttgl.SliceLayout(1, ML))
        acc = ttgl.zeros([GPN, D], ttgl.float32, layout=ML)
        for i in range(num_splits):
            lse = ttgl.load(LSE + base + i, mask=hm, other=float("-inf"), cache_modifier=".cg")
            o = ttgl.load(OP + (base + i)[:, None] * D + d[None, :], mask=(hm & (lse != float("-inf")))[:, None],
                          other=0.0, cache_modifier=".cg")  # an empty split left its partial unwritten
            mn = ttgl.maximum(m, lse)
            ms = ttgl.where(mn == float("-inf"), 0.0, mn)
            a = ttgl.exp2(m - ms)
            w = ttgl.exp2(lse - ms)
            acc = acc * a[:, None] + o * w[:, None]
            tot = tot * a + w
            m = mn
        out = acc / ttgl.where(tot != 0, tot, 1.0)[:, None]
        ttgl.store(OUT + b * so0 + (hk * GROUP + rows)[:, None] * so1 + d[None, :], out.to(OUT.dtype.element_ty),
                   mask=hm[:, None])
        ttgl.atomic_xchg(CNT + cidx, 0, sem="relaxed", scope="gpu")


@gluon.jit
def _k_tile(KC, KS, KZ, IDX, t0, hi, hk, kc0, kc1, ks0, ks1, KCODEC: ttgl.constexpr, WK: ttgl.constexpr,
            GK: ttgl.constexpr, P: ttgl.constexpr, TW: ttgl.constexpr, KW: ttgl.constexpr, KCL: ttgl.constexpr,
            NW: ttgl.constexpr, D: ttgl.constexpr, PS: ttgl.constexpr, KSD: ttgl.constexpr, KCHAN: ttgl.constexpr,
            MASK: ttgl.constexpr = True, KX: ttgl.constexpr = None, KA: ttgl.constexpr = None):
    """The K code words, second words, scales and zeros of the tile from token t0 (`kc_load` for channel-axis keys,
    else `k_load`; KX / KA: its layouts for keys by groups)."""
    if KCHAN:
        return kc_load(KC, KS, KZ, IDX, t0, hi, hk, kc0, kc1, ks0, ks1, KCODEC, GK, P, TW, KCL, NW, D, PS, MASK)
    else:
        return k_load(KC, KS, KZ, IDX, t0, hi, hk, kc0, kc1, ks0, ks1, KCODEC, WK, GK, P, TW, KW, NW, D, PS, KSD,
                      MASK, KX, KA)


@gluon.jit
def _tile_codes(KC, KS, KZ, VC, VS, VZ, IDX, t0, hi, hk, kc0, kc1, ks0, ks1, vc0, vc1, vs0, vs1,
                KCODEC: ttgl.constexpr, VCODEC: ttgl.constexpr, WK: ttgl.constexpr, WV: ttgl.constexpr,
                GK: ttgl.constexpr, GV: ttgl.constexpr, P: ttgl.constexpr, TW: ttgl.constexpr, KW: ttgl.constexpr,
                KCL: ttgl.constexpr, VW: ttgl.constexpr, VWA: ttgl.constexpr, NW: ttgl.constexpr, D: ttgl.constexpr,
                PS: ttgl.constexpr, KSD: ttgl.constexpr, VSD: ttgl.constexpr, KCHAN: ttgl.constexpr,
                MASK: ttgl.constexpr = True, KX: ttgl.constexpr = None, KA: ttgl.constexpr = None):
    """Every code register of the tile from token t0: K words, second words, scales, zeros (`_k_tile`), then V's
    (`v_load`), as one 12-tuple. MASK False: the tile lies before `hi` (no masked load)."""
    kw, kw2, ks, kz = _k_tile(KC, KS, KZ, IDX, t0, hi, hk, kc0, kc1, ks0, ks1, KCODEC, WK, GK, P, TW, KW, KCL, NW, D,
                              PS, KSD, KCHAN, MASK, KX, KA)
    va, vb, vsa, vsb, vza, vzb, vpa, vpb = v_load(VC, VS, VZ, IDX, t0, hi, hk, vc0, vc1, vs0, vs1, VCODEC, WV, GV, P,
                                                  TW, VW, VWA, NW, D, KCHAN, PS, VSD, MASK)
    return kw, kw2, ks, kz, va, vb, vsa, vsb, vza, vzb, vpa, vpb


@gluon.jit
def _attend_tile(q, c, t0, hi, q_tok, m_i, l_i, acc, ktab, vtab, KCODEC: ttgl.constexpr, VCODEC: ttgl.constexpr,
                 B: ttgl.constexpr, NW: ttgl.constexpr, TW: ttgl.constexpr, D: ttgl.constexpr, GK: ttgl.constexpr,
                 MMA: ttgl.constexpr, GP: ttgl.constexpr, ROWS: ttgl.constexpr, SR: ttgl.constexpr,
                 OT: ttgl.constexpr, A: ttgl.constexpr, GPN: ttgl.constexpr, KCHAN: ttgl.constexpr,
                 ST: ttgl.constexpr = False, MASK: ttgl.constexpr = True):
    """One tile's scores, online softmax and P V from its code registers c (`_tile_codes`): the body of
    `_decode_mma_kernel`'s tile loop (rolled or unrolled by two). ST: scores transposed (`_scores_t`; q is Q^T; 2:
    with the lazy rescale, `_online_t`).
    MASK False: every token of the tile lies before `hi` (no score mask)."""
    kw, kw2, ks, kz, va, vb, vsa, vsb, vza, vzb, vpa, vpb = c
    if KCHAN:
        kt = kc_build(kw, kw2, ks, kz, KCODEC, B, NW, TW, D, ktab)
    else:
        kt = k_build(kw, kw2, ks, kz, KCODEC, B, NW, TW, D, GK, ktab)
    if ST:
        if KCODEC == C_KF4 or KCODEC == C_KF2:
            s = _scores_tf(q, kt, ks, kz, MMA, A, B, 16 if KCODEC == C_KF4 else 4)
        elif KCODEC == C_Q4G:  # (q: Q^T and the offsets' B fragment)
            qt, bc = q
            s = _scores_tg(qt, bc, kt, ks, kz, MMA, A, B, D)
        else:
            s = _scores_t(q, kt, MMA, A)
        s, m_i, l_i, alpha = _online_t(s, (t0 + q_tok) < hi, m_i, l_i, MASK, ST == 2)
        if ST == 2:  # (before the values are decoded: fewer registers live across the branch)
            acc = _rescale(acc, alpha)
    else:
        s, m_i, l_i, alpha = _scores(q, kt, (t0 + q_tok) < hi, m_i, l_i, MMA, GP, TW, NW, ROWS, SR, MASK)
    vt = v_build(va, vb, vsa, vsb, vza, vzb, vpa, vpb, VCODEC, B, NW, TW, D, vtab)
    if ST:
        acc = _pv_t(s, vt, acc, alpha, A, B, ST != 2)
    else:
        acc = _pv(s, vt, acc, alpha, OT, A, B, MMA, GPN, NW)
    return m_i, l_i, acc


@gluon.jit
def _decode_mma_kernel(Q, OUT, OP, LSE, CNT, KC, KS, KZ, VC, VS, VZ, KTS, VTS, KPERM, VPERM, TAB, INDPTR, INDICES,
                       LAST, qk_scale, num_splits, sq0, sq1, so0, so1, kc0, kc1, ks0, ks1, vc0, vc1,
                       vs0, vs1, KCODEC: ttgl.constexpr, VCODEC: ttgl.constexpr, WK: ttgl.constexpr, WV: ttgl.constexpr,
                       GK: ttgl.constexpr, GV: ttgl.constexpr,
                       HAS_KTS: ttgl.constexpr, HAS_VTS: ttgl.constexpr,
                       GROUP: ttgl.constexpr, P: ttgl.constexpr, NW: ttgl.constexpr, TW: ttgl.constexpr,
                       DIRECT: ttgl.constexpr, MMA: ttgl.constexpr, A: ttgl.constexpr, B: ttgl.constexpr,
                       KW: ttgl.constexpr, VW: ttgl.constexpr, VWA: ttgl.constexpr, OT: ttgl.constexpr,
                       GPN: ttgl.constexpr, D: ttgl.constexpr, KCHAN: ttgl.constexpr, KCL: ttgl.constexpr,
                       FUSED: ttgl.constexpr, ML: ttgl.constexpr, SR: ttgl.constexpr, PS: ttgl.constexpr,
                       KSD: ttgl.constexpr = 0, VSD: ttgl.constexpr = 0, PF: ttgl.constexpr = True,
                       U2: ttgl.constexpr = False, L2PF: ttgl.constexpr = 0, PFL: ttgl.constexpr = None,
                       NLP: ttgl.constexpr = 32, L2N: ttgl.constexpr = (0,) * 6, L2B: ttgl.constexpr = (0,) * 6,
                       L2U: ttgl.constexpr = (0,) * 6, L2S: ttgl.constexpr = (0,) * 6,
                       L2E: ttgl.constexpr = (0,) * 6, ST: ttgl.constexpr = False, FT: ttgl.constexpr = False,
                       KX: ttgl.constexpr = None, KA: ttgl.constexpr = None):
    """q [B, Hq, D]; K / V codes as int32 words [N, Hk, P, D bits / 32] and fp16 scales [N, Hk, P, D / G]
    (or e8m0 / e4m3 scale bytes: KSD / VSD, `SCALE_DTYPES`; page strides in units of PS elements, head strides in
    elements of those views; KCHAN: channel-axis keys as `kc_load` reads them, and
    tile positions through `tile_tok` for K, V and the scores alike); KTS / VTS: fp32 per-tensor scales (HAS_*);
    full-precision tokens (sinks, window) are attended beside the split merge (`merge_with_fp`), not here.
    A split left without tokens writes only a -inf log2-sum-exp, which every merge skips. Writes OUT [B, Hq, D]
    (DIRECT) or OP [B, Hq, S, D] + LSE [B, Hq, S] (log2), merged into OUT by the last split program (FUSED; CNT
    [B * Hk] int32 counters, zero between calls). PF: the next tile's code words are loaded before this tile's
    math (a register prefetch), else each tile loads its own. U2 (with PF): the loop unrolled by two, so the two
    tiles' code registers swap roles instead of the prefetched ones being copied at the end of every tile.
    L2PF > 0: each tile also prefetches into L2 the lines of the tile L2PF tiles ahead of its load (`_l2_issue`;
    L2N / L2B / L2U / L2S / L2E: per tensor (K codes, scales, zeros, V codes, scales, zeros) lines, bytes, unit
    bytes, unit shift and element bytes of a warp's page part (`l2_parts`); layout PFL [NW, NLP]).
    ST (with OT and GPN 8): the scores transposed, S^T = K Q^T (`_scores_t`): q is loaded as Q^T [NW, D, GPN] and
    the softmax state lies in the accumulator's column layout; ST 2: with the lazy rescale (`LAZY_RESCALE`).
    FT: the tiles that lie wholly before `hi` are loaded and scored without masks (with U2, two an iteration while
    the tiles loaded are whole, then one at a time); only a split's last, partial tile (and the register prefetch of
    it) keeps them; the L2 prefetch issues as in the masked loop."""
    b = ttgl.program_id(0)
    hk = ttgl.program_id(1)
    sp = ttgl.program_id(2)
    BN: ttgl.constexpr = NW * TW
    p0 = ttgl.load(INDPTR + b)
    p1 = ttgl.load(INDPTR + b + 1)
    L = ttgl.where(p1 > p0, (p1 - p0 - 1) * P + ttgl.load(LAST + b), 0)
    per = ttgl.cdiv(ttgl.cdiv(L, num_splits), BN) * BN  # tokens per split, whole tiles
    lo = sp * per
    hi = ttgl.minimum(lo + per, L)
    # a split past the sequence's end (short contexts: 512 tokens at 9 splits of 128-token tiles leave 5 empty)
    # writes only its log2-sum-exp (-inf), which every merge skips, and returns before any load (DIRECT: one
    # split, which writes the output, zeros for an empty sequence)
    ROWS: ttgl.constexpr = GPN if OT else GP  # softmax rows kept (GPN with O^T, else the GP padded rows)
    # layout of the [NW, ROWS] softmax state, and of a [ROWS] log2-sum-exp
    STL: ttgl.constexpr = ttgl.SliceLayout(1, MMA) if ST else ttgl.SliceLayout(2, SR)
    LROW: ttgl.constexpr = ttgl.SliceLayout(0, STL)
    if not DIRECT:
        if hi <= lo:
            lg0 = ttgl.arange(0, ROWS, layout=LROW)
            lrow0 = (b * ttgl.num_programs(1) * GROUP + hk * GROUP + lg0) * num_splits + sp
            ttgl.store(LSE + lrow0, ttgl.full([ROWS], float("-inf"), ttgl.float32, layout=LROW), mask=lg0 < GROUP)
            if FUSED:
                _merge_last(OP, LSE, OUT, CNT, b, hk, num_splits, so0, so1, GROUP, GPN, D, ML)
            return
    IDX = INDICES + p0

    # queries [NW (same for every warp), GP, D] in kappa order (ST: Q^T [NW, D, GPN]), scaled by qk_scale (log2
    # domain)
    if ST:
        qz = ttgl.arange(0, NW, layout=ttgl.SliceLayout(1, ttgl.SliceLayout(2, B)))
        qg = ttgl.arange(0, GPN, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(1, B)))
        kap = ttgl.arange(0, D, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(2, B)))
        qch = ttgl.load(KPERM + kap)  # head-dim channel of contraction index kappa (k_channel_order)
        qrow = qz[:, None, None] * 0 + qg[None, None, :]
        qm = (qrow < GROUP) & (qch[None, :, None] < D)
        q = ttgl.load(Q + b * sq0 + (hk * GROUP + qrow) * sq1 + qch[None, :, None], mask=qm, other=0.0)
    else:
        qz = ttgl.arange(0, NW, layout=ttgl.SliceLayout(1, ttgl.SliceLayout(2, A)))
        qg = ttgl.arange(0, GP, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(2, A)))
        kap = ttgl.arange(0, D, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(1, A)))
        qch = ttgl.load(KPERM + kap)  # head-dim channel of contraction index kappa (k_channel_order)
        qrow = qz[:, None, None] * 0 + qg[None, :, None]
        qm = (qrow < GROUP) & (qch[None, None, :] < D)
        q = ttgl.load(Q + b * sq0 + (hk * GROUP + qrow) * sq1 + qch[None, None, :], mask=qm, other=0.0)
    qs = qk_scale
    if HAS_KTS:
        qs = qs * ttgl.load(KTS)
    q = (q.to(ttgl.float32) * qs).to(ttgl.float16)
    if KCODEC == C_Q4G:  # keys by groups (`_scores_tg`): the high nibbles' entries divided by 16; the offsets' B
        # fragment: rows 2 g and 2 g + 1 the fp16 high and low parts of -C_g [h], C_g the sum over group g of the
        # entries (as the MMA reads them) times 1032 (low nibbles: 1024 + n - 1032 = n - 8) or 1152 (1024 + 16 n - 1152
        # = 16 (n - 8)); zero rows up to 16
        NG: ttgl.constexpr = D // 32
        hib = ((kap >> 3) & 1) == 1  # contraction index kappa's nibble (`k_channel_order`)
        q = (q.to(ttgl.float32) * ttgl.where(hib, 0.0625, 1.0)[None, :, None]).to(ttgl.float16)
        off = q.to(ttgl.float32) * ttgl.where(hib, 1152.0, 1032.0)[None, :, None]
        cg = -ttgl.sum(ttgl.reshape(off, [NW, NG, 32, GPN]), 2)  # [NW, NG, GPN]
        bc = ttgl.reshape(ttgl.permute(_hi_lo(cg), [0, 1, 3, 2]), [NW, 2 * NG, GPN])
        if NG <= 4:
            bc = _pad_rows(bc)
        if NG == 2:
            bc = _pad_rows(bc)
        q = (q, ttgl.convert_layout(bc, B))

    # codebook tables (CB): 8 words each for K and V
    ktab = (ttgl.load(TAB + 0), ttgl.load(TAB + 1), ttgl.load(TAB + 2), ttgl.load(TAB + 3), ttgl.load(TAB + 4),
            ttgl.load(TAB + 5), ttgl.load(TAB + 6), ttgl.load(TAB + 7))
    vtab = (ttgl.load(TAB + 8), ttgl.load(TAB + 9), ttgl.load(TAB + 10), ttgl.load(TAB + 11), ttgl.load(TAB + 12),
            ttgl.load(TAB + 13), ttgl.load(TAB + 14), ttgl.load(TAB + 15))

    # token index helpers: score tile [NW, GP, TW] and the word / scale tiles of K and V
    SL: ttgl.constexpr = ttgl.SliceLayout(2, MMA) if ST else ttgl.SliceLayout(1, MMA)  # [NW, TW] of the scores
    sw = ttgl.arange(0, NW, layout=ttgl.SliceLayout(1, SL))
    sn = ttgl.arange(0, TW, layout=ttgl.SliceLayout(0, SL))
    q_tok = (sw * TW)[:, None] + tile_tok(sn, TW, KCHAN)[None, :]  # ... of each paged token's score column

    # softmax state of the score rows kept (ROWS; layout SR)
    m_i = ttgl.full([NW, ROWS], float("-inf"), ttgl.float32, layout=STL)
    if ST:  # (per score: summed over the tokens after the loop)
        l_i = ttgl.zeros([NW, TW, ROWS], ttgl.float32, layout=MMA)
    else:
        l_i = ttgl.zeros([NW, ROWS], ttgl.float32, layout=STL)
    if OT:
        acc = ttgl.zeros([NW, D, GPN], ttgl.float32, layout=MMA)  # O^T
    else:
        acc = ttgl.zeros([NW, GP, D], ttgl.float32, layout=MMA)
    if L2PF > 0:  # each prefetch line's tensor, page part and offset (`_l2_take`, once)
        NPW: ttgl.constexpr = TW // P if TW > P else 1  # page parts a warp's tile
        AHEAD: ttgl.constexpr = L2PF + (1 if PF else 0)  # (with the register prefetch, a tile loads one tile early)
        C1: ttgl.constexpr = NPW * L2N[0]
        C2: ttgl.constexpr = C1 + NPW * L2N[1]
        C3: ttgl.constexpr = C2 + NPW * L2N[2]
        C4: ttgl.constexpr = C3 + NPW * L2N[3]
        C5: ttgl.constexpr = C4 + NPW * L2N[4]
        NL: ttgl.constexpr = C5 + NPW * L2N[5]
        lane = ttgl.arange(0, NLP, layout=ttgl.SliceLayout(0, PFL))
        z = lane * 0
        ln = (z.to(ttgl.int64), z, z, z, z)
        ln = _l2_take(lane, ln, KC, kc0, kc1, hk, 0, L2N[0], NPW, L2B[0], L2U[0], L2S[0], L2E[0], PS)
        ln = _l2_take(lane, ln, KS, ks0, ks1, hk, C1, L2N[1], NPW, L2B[1], L2U[1], L2S[1], L2E[1], PS)
        ln = _l2_take(lane, ln, KZ, ks0, ks1, hk, C2, L2N[2], NPW, L2B[2], L2U[2], L2S[2], L2E[2], PS)
        ln = _l2_take(lane, ln, VC, vc0, vc1, hk, C3, L2N[3], NPW, L2B[3], L2U[3], L2S[3], L2E[3], PS)
        ln = _l2_take(lane, ln, VS, vs0, vs1, hk, C4, L2N[4], NPW, L2B[4], L2U[4], L2S[4], L2E[4], PS)
        ln = _l2_take(lane, ln, VZ, vs0, vs1, hk, C5, L2N[5], NPW, L2B[5], L2U[5], L2S[5], L2E[5], PS)
        p_j = ln[4]
        for k in ttgl.static_range(1, AHEAD):  # the tiles the loop's first prefetches would come too late for
            _l2_issue(lo + k * BN, hi, _l2_pages(IDX, lo + k * BN, hi, p_j, P, TW, NW, PFL), ln, lane, NL, P, TW, NW,
                      PFL)
        pgp = _l2_pages(IDX, lo + AHEAD * BN, hi, p_j, P, TW, NW, PFL)  # (loaded a tile before its use)
    if PF and U2 and not FT:  # two tiles an iteration: the code registers of tile i + 1 load while tile i is
        # attended, those of tile i + 2 while tile i + 1 is (loads past hi read page 0: unused)
        cur = _tile_codes(KC, KS, KZ, VC, VS, VZ, IDX, lo, hi, hk, kc0, kc1, ks0, ks1, vc0, vc1, vs0, vs1, KCODEC,
                          VCODEC, WK, WV, GK, GV, P, TW, KW, KCL, VW, VWA, NW, D, PS, KSD, VSD, KCHAN, KX=KX, KA=KA)
        n_t = ttgl.cdiv(hi - lo, BN)
        for i in range(0, n_t // 2):
            t0 = lo + 2 * i * BN
            if L2PF > 0:
                pgq = _l2_step(IDX, t0, hi, pgp, ln, lane, AHEAD, BN, NL, P, TW, NW, PFL)
            nxt = _tile_codes(KC, KS, KZ, VC, VS, VZ, IDX, t0 + BN, hi, hk, kc0, kc1, ks0, ks1, vc0, vc1, vs0, vs1,
                              KCODEC, VCODEC, WK, WV, GK, GV, P, TW, KW, KCL, VW, VWA, NW, D, PS, KSD, VSD, KCHAN,
                              KX=KX, KA=KA)
            m_i, l_i, acc = _attend_tile(q, cur, t0, hi, q_tok, m_i, l_i, acc, ktab, vtab, KCODEC, VCODEC, B, NW, TW,
                                         D, GK, MMA, GP, ROWS, SR, OT, A, GPN, KCHAN, ST)
            if L2PF > 0:
                pgp = _l2_step(IDX, t0 + BN, hi, pgq, ln, lane, AHEAD, BN, NL, P, TW, NW, PFL)
            cur = _tile_codes(KC, KS, KZ, VC, VS, VZ, IDX, t0 + 2 * BN, hi, hk, kc0, kc1, ks0, ks1, vc0, vc1, vs0,
                              vs1, KCODEC, VCODEC, WK, WV, GK, GV, P, TW, KW, KCL, VW, VWA, NW, D, PS, KSD, VSD, KCHAN,
                              KX=KX, KA=KA)
            m_i, l_i, acc = _attend_tile(q, nxt, t0 + BN, hi, q_tok, m_i, l_i, acc, ktab, vtab, KCODEC, VCODEC, B,
                                         NW, TW, D, GK, MMA, GP, ROWS, SR, OT, A, GPN, KCHAN, ST)
        if n_t % 2 == 1:  # the last tile, whose codes `cur` holds
            m_i, l_i, acc = _attend_tile(q, cur, lo + (n_t - 1) * BN, hi, q_tok, m_i, l_i, acc, ktab, vtab, KCODEC,
                                         VCODEC, B, NW, TW, D, GK, MMA, GP, ROWS, SR, OT, A, GPN, KCHAN, ST)
    elif FT:  # whole tiles without masks, then the partial last tile with them
        if PF:
            c = _tile_codes(KC, KS, KZ, VC, VS, VZ, IDX, lo, hi, hk, kc0, kc1, ks0, ks1, vc0, vc1, vs0, vs1, KCODEC,
                            VCODEC, WK, WV, GK, GV, P, TW, KW, KCL, VW, VWA, NW, D, PS, KSD, VSD, KCHAN, KX=KX, KA=KA)
        t_end = lo + ((hi - lo) // BN) * BN  # the first token past the whole tiles (hi when there is no partial one)
        t_s = lo  # the first tile the rolled loop attends
        if PF and U2:  # two whole tiles an iteration while the tiles it loads (i + 1, i + 2) are whole too; the rolled
            # loop below takes the rest (the two code register sets swap roles instead of being copied)
            for t0 in range(lo, t_end - 2 * BN, 2 * BN):
                if L2PF > 0:
                    pgp = _l2_step(IDX, t0, hi, pgp, ln, lane, AHEAD, BN, NL, P, TW, NW, PFL)
                nxt = _tile_codes(KC, KS, KZ, VC, VS, VZ, IDX, t0 + BN, hi, hk, kc0, kc1, ks0, ks1, vc0, vc1, vs0, vs1,
                                  KCODEC, VCODEC, WK, WV, GK, GV, P, TW, KW, KCL, VW, VWA, NW, D, PS, KSD, VSD, KCHAN,
                                  False, KX=KX, KA=KA)
                m_i, l_i, acc = _attend_tile(q, c, t0, hi, q_tok, m_i, l_i, acc, ktab, vtab, KCODEC, VCODEC, B, NW,
                                             TW, D, GK, MMA, GP, ROWS, SR, OT, A, GPN, KCHAN, ST, False)
                if L2PF > 0:
                    pgp = _l2_step(IDX, t0 + BN, hi, pgp, ln, lane, AHEAD, BN, NL, P, TW, NW, PFL)
                c = _tile_codes(KC, KS, KZ, VC, VS, VZ, IDX, t0 + 2 * BN, hi, hk, kc0, kc1, ks0, ks1, vc0, vc1, vs0,
                                vs1, KCODEC, VCODEC, WK, WV, GK, GV, P, TW, KW, KCL, VW, VWA, NW, D, PS, KSD, VSD,
                                KCHAN, False, KX=KX, KA=KA)
                m_i, l_i, acc = _attend_tile(q, nxt, t0 + BN, hi, q_tok, m_i, l_i, acc, ktab, vtab, KCODEC, VCODEC,
                                             B, NW, TW, D, GK, MMA, GP, ROWS, SR, OT, A, GPN, KCHAN, ST, False)
                t_s = t0 + 2 * BN
        # (PF: the loop stops a tile early, as the last whole tile prefetches the partial one, masked)
        for t0 in range(t_s, t_end - BN if PF else t_end, BN):
            if L2PF > 0:
                pgp = _l2_step(IDX, t0, hi, pgp, ln, lane, AHEAD, BN, NL, P, TW, NW, PFL)
            nc = _tile_codes(KC, KS, KZ, VC, VS, VZ, IDX, t0 + BN if PF else t0, hi, hk, kc0, kc1, ks0, ks1, vc0, vc1,
                             vs0, vs1, KCODEC, VCODEC, WK, WV, GK, GV, P, TW, KW, KCL, VW, VWA, NW, D, PS, KSD, VSD,
                             KCHAN, False, KX=KX, KA=KA)
            if not PF:
                c = nc
            m_i, l_i, acc = _attend_tile(q, c, t0, hi, q_tok, m_i, l_i, acc, ktab, vtab, KCODEC, VCODEC, B, NW, TW,
                                         D, GK, MMA, GP, ROWS, SR, OT, A, GPN, KCHAN, ST, False)
            if PF:
                c = nc
        if PF:
            if t_end > lo:  # the last whole tile; the codes it prefetches are the partial tile's (or past the end: a
                # masked load, as the masked loop's last; guarding it on a partial tile made KIVI's kernel spill)
                if L2PF > 0:
                    pgp = _l2_step(IDX, t_end - BN, hi, pgp, ln, lane, AHEAD, BN, NL, P, TW, NW, PFL)
                nc = _tile_codes(KC, KS, KZ, VC, VS, VZ, IDX, t_end, hi, hk, kc0, kc1, ks0, ks1, vc0, vc1, vs0, vs1,
                                 KCODEC, VCODEC, WK, WV, GK, GV, P, TW, KW, KCL, VW, VWA, NW, D, PS, KSD, VSD, KCHAN,
                                 KX=KX, KA=KA)
                m_i, l_i, acc = _attend_tile(q, c, t_end - BN, hi, q_tok, m_i, l_i, acc, ktab, vtab, KCODEC, VCODEC,
                                             B, NW, TW, D, GK, MMA, GP, ROWS, SR, OT, A, GPN, KCHAN, ST, False)
                c = nc
        if t_end < hi:
            if L2PF > 0:
                pgp = _l2_step(IDX, t_end, hi, pgp, ln, lane, AHEAD, BN, NL, P, TW, NW, PFL)
            if not PF:
                c = _tile_codes(KC, KS, KZ, VC, VS, VZ, IDX, t_end, hi, hk, kc0, kc1, ks0, ks1, vc0, vc1, vs0, vs1,
                                KCODEC, VCODEC, WK, WV, GK, GV, P, TW, KW, KCL, VW, VWA, NW, D, PS, KSD, VSD, KCHAN,
                                KX=KX, KA=KA)
            m_i, l_i, acc = _attend_tile(q, c, t_end, hi, q_tok, m_i, l_i, acc, ktab, vtab, KCODEC, VCODEC, B, NW,
                                         TW, D, GK, MMA, GP, ROWS, SR, OT, A, GPN, KCHAN, ST)
    else:
        if PF:
            c = _tile_codes(KC, KS, KZ, VC, VS, VZ, IDX, lo, hi, hk, kc0, kc1, ks0, ks1, vc0, vc1, vs0, vs1, KCODEC,
                            VCODEC, WK, WV, GK, GV, P, TW, KW, KCL, VW, VWA, NW, D, PS, KSD, VSD, KCHAN, KX=KX, KA=KA)
        for t0 in range(lo, hi, BN):
            if L2PF > 0:
                pgp = _l2_step(IDX, t0, hi, pgp, ln, lane, AHEAD, BN, NL, P, TW, NW, PFL)
            # PF: the next tile's codes are requested before this tile's math (software prefetch into registers);
            # else this tile's codes only: half the code registers (channel-axis keys at head_dim 256 spill otherwise)
            nc = _tile_codes(KC, KS, KZ, VC, VS, VZ, IDX, t0 + BN if PF else t0, hi, hk, kc0, kc1, ks0, ks1, vc0, vc1,
                             vs0, vs1, KCODEC, VCODEC, WK, WV, GK, GV, P, TW, KW, KCL, VW, VWA, NW, D, PS, KSD, VSD,
                             KCHAN, KX=KX, KA=KA)
            if not PF:
                c = nc
            m_i, l_i, acc = _attend_tile(q, c, t0, hi, q_tok, m_i, l_i, acc, ktab, vtab, KCODEC, VCODEC, B, NW, TW,
                                         D, GK, MMA, GP, ROWS, SR, OT, A, GPN, KCHAN, ST)
            if PF:
                c = nc

    # merge the warps' softmax states
    if ST:
        l_i = ttgl.sum(l_i, 1)
    m_all = ttgl.max(m_i, 0)  # [ROWS]
    m_all_safe = ttgl.where(m_all == float("-inf"), 0.0, m_all)
    wgt = ttgl.exp2(m_i - m_all_safe[None, :])  # [NW, ROWS]
    l_all = ttgl.sum(l_i * wgt, 0)  # [ROWS]
    inv = ttgl.where(l_all != 0, 1.0 / ttgl.where(l_all != 0, l_all, 1.0), 0.0)  # no token -> 0; NaN stays NaN
    if HAS_VTS:
        inv = inv * ttgl.load(VTS)
    OL: ttgl.constexpr = ttgl.SliceLayout(0, MMA)
    if OT:
        sc = ttgl.convert_layout(wgt * inv[None, :], ttgl.SliceLayout(1, MMA))
        o = ttgl.sum(acc * sc[:, None, :], 0)  # O^T [D, GPN]
        od = ttgl.arange(0, D, layout=ttgl.SliceLayout(1, OL))
        og = ttgl.arange(0, GPN, layout=ttgl.SliceLayout(0, OL))
        och = ttgl.load(VPERM + od)[:, None]  # head-dim channel of accumulator row d (v_channel_order)
        og = og[None, :]
    else:
        o = ttgl.sum(acc * (wgt * inv[None, :])[:, :, None], 0)  # [GP, D]
        og = ttgl.arange(0, GP, layout=ttgl.SliceLayout(1, OL))
        on = ttgl.arange(0, D, layout=ttgl.SliceLayout(0, OL))
        och = ttgl.load(VPERM + on)[None, :]  # head-dim channel of output column n (v_channel_order)
        og = og[:, None]
    heads = hk * GROUP + og
    om = (og < GROUP) & (och < D)
    if DIRECT:
        ttgl.store(OUT + b * so0 + heads * so1 + och, o.to(OUT.dtype.element_ty), mask=om)
    else:
        row = (b * ttgl.num_programs(1) * GROUP + heads) * num_splits + sp
        ttgl.store(OP + row * D + och, o, mask=om)
        lse = ttgl.where(l_all != 0, m_all + ttgl.log2(ttgl.where(l_all != 0, l_all, 1.0)), float("-inf"))
        lg = ttgl.arange(0, ROWS, layout=LROW)
        lrow = (b * ttgl.num_programs(1) * GROUP + hk * GROUP + lg) * num_splits + sp
        ttgl.store(LSE + lrow, lse, mask=lg < GROUP)
        if FUSED:
            _merge_last(OP, LSE, OUT, CNT, b, hk, num_splits, so0, so1, GROUP, GPN, D, ML)


# ---- host side ------------------------------------------------------------------------------------
def scores_t(config: GluonDecodeConfig, group: int) -> bool:
    """Whether a launch of `config` for GQA groups of `group` query heads transposes its scores (constexpr ST): the
    config's `scores_t` (None: `SCORES_T`), with the O^T accumulator and groups of up to 8 only."""
    on = SCORES_T if config.scores_t is None else config.scores_t
    return bool(on and config.transpose_o and group <= 8)


def kivi_folds(kcodec: int, config: GluonDecodeConfig, group: int) -> bool:
    """Whether a call folds its keys' scales and zeros out of the tile (`C_KF4`, `C_KF2`): KIVI_FOLD on, KIVI's int4
    or int2 channel-axis keys (any group of 32 tokens or more, fp16 scale and zero pairs), the transposed scores."""
    return KIVI_FOLD and kcodec in (KC4, KC2) and scores_t(config, group)


def grouped_k(kcodec: int, k_spec, D: int, config: GluonDecodeConfig, group: int) -> bool:
    """Whether a call reads its keys by scale groups (`C_Q4G`): GROUPED_K on, int4 sym keys (q4_0's codec) at groups
    of 32 with fp16 scales, the transposed scores, head_dim 64, 128 or 256."""
    return GROUPED_K and kcodec == Q4 and _group(k_spec) == 32 and not scale_code(k_spec) and \
        scores_t(config, group) and D in (64, 128, 256)


def unsupported(k_spec, v_spec, D: int, P: int, group: int, device, tokens_per_warp: int | None = None) -> str | None:
    """None when the Gluon MMA kernel runs specs k_spec / v_spec at head_dim D, page size P and GQA group
    `group` on `device` (with `tokens_per_warp`, when given); else the reason it does not."""
    sides = (("K", k_spec, codec_of(k_spec, "k")), ("V", v_spec, codec_of(v_spec, "v")))
    for name, spec, codec in sides:
        if codec is None:
            return (f"{name} spec {spec} has no Gluon codec (supported: " + "; ".join(CODECS.values()) +
                    "; channel-axis codecs for keys only; Hadamard rotation allowed; keys after RoPE)")
    if sides[0][2] in CHAN:
        if tokens_per_warp not in (None, CHAN_TW):
            return f"channel-axis keys ({k_spec}) run with tokens_per_warp={CHAN_TW}, got {tokens_per_warp}"
        if k_spec.group % CHAN_TW:
            return f"channel-axis keys need token groups that are a multiple of {CHAN_TW}, got {k_spec.group}"
    if D not in HEAD_DIMS:
        return f"head_dim must be one of {HEAD_DIMS}, got {D}"
    for name, spec, codec in sides:  # a thread's D / 8 value channels lie in one group, and D / 4 key channels
        per = D // 4 if name == "K" else D // 8  # unless the keys (or fp4 values) read a scale per code word
        if codec not in (F8, *CHAN) and per > _group(spec) and \
                not (codec in PER_WORD and (name == "K" or codec in V_PER_WORD)):
            return (f"{name} groups of {spec.group} channels at head_dim {D}: a thread's {per} channels would span "
                    f"two groups (use groups of {per} or more)")
    if P % PAGE_UNIT:
        return f"page size must be a multiple of {PAGE_UNIT}, got {P}"
    if group > GP.value:
        return f"GQA group must be <= {GP.value}, got {group}"
    dev = torch.device(device)
    if dev.type != "cuda":
        return "needs a CUDA GPU with mma.sync (sm_80+; sm_89+ for fp8)"
    e4m3 = F8 in (sides[0][2], sides[1][2]) or "e4m3" in (k_spec.scale_dtype, v_spec.scale_dtype)  # (nvfp4 too)
    need = (8, 9) if e4m3 else (8, 0)  # (e4m3 conversion)
    cap = tuple(torch.cuda.get_device_capability(dev))
    if cap < need:
        return f"needs sm_{need[0]}{need[1]}+ (mma.sync{', fp8 conversion' if need[1] else ''}); this GPU is sm_{cap[0]}{cap[1]}"
    return None


def _tile_dense(t: torch.Tensor) -> bool:
    """True when each (page, head) tile of a page tensor [N, Hk, ...] is one dense block (row-major)."""
    want = 1
    for size, stride in zip(reversed(t.shape[2:]), reversed(t.stride()[2:])):
        if size != 1 and stride != want:
            return False
        want *= size
    return True


def l2_parts(parts, P: int, TW: int) -> dict | None:
    """The L2 prefetch's line layout (config `l2_prefetch`) as the kernel's constexprs, or None where it does not
    apply. parts: six (page tensor [N, Hk, ...] as the kernel reads it, or None; tokens a unit) for K codes, scales,
    zeros and V codes, scales, zeros; a unit is a token (its row of the (page, head) tile) or, for channel-axis keys,
    a token group (its block of the tile). A warp's part of a tile is min(TW, P) tokens of each of max(1, TW / P)
    pages: ceil(bytes / 128) lines, one more where a part may start off a 128-byte line (from the tensor's address
    class and strides: only that alignment is a constexpr, never an address, so pools share compiled kernels and a
    captured graph holds no table). None where P > TW and P % TW: a warp's tokens would cross into the next page
    mid-tile (`tok_rows`' second case), which the prefetch does not lay out."""
    if P > TW and P % TW:
        return None
    n, b, u, sh, es = ([0] * 6 for _ in range(5))
    for tid, (t, unit) in enumerate(parts):
        if t is None:
            continue
        e = t.element_size()
        ub = math.prod(t.shape[2:]) * e * unit // P  # bytes a unit
        nbytes = max(1, min(TW, P) // unit) * ub  # bytes of a part
        starts = {(r0 // unit) * ub for r0 in range(0, P, TW)} if P >= TW else {0}
        aligned = all(x % L2_LINE == 0 for x in (t.data_ptr(), t.stride(0) * e, t.stride(1) * e, *starts))
        n[tid] = -(-nbytes // L2_LINE) + (0 if aligned else 1)
        b[tid], u[tid], sh[tid], es[tid] = nbytes, ub, unit.bit_length() - 1, e
    total = sum(n) * max(1, TW // P)
    return dict(L2N=tuple(n), L2B=tuple(b), L2U=tuple(u), L2S=tuple(sh), L2E=tuple(es),
                NLP=max(32, 1 << (total - 1).bit_length()))


def prefetches(kcodec: int, D: int) -> bool:
    """The default of `GluonDecodeConfig.prefetch`: the register prefetch of the next tile's codes, except for
    channel-axis int4 / int3 keys at head_dim 256. There a thread holds D / 8 code units, unit pairs, scale and zero
    pairs of its K rows and the prefetch doubles them: offline sm_90 (`python -m devtools.sm90_offline gluon:kivi4
    --head-dim 256 --tw 32 --page 32 --no-fp --prefetch on|off`) 255 registers and 216 bytes of stack with it, 211
    and none without; on the H200 (B 32 x 8K, Hk 4, sweeps/results/h200/runs/s15-ca78947/) kivi4 0.327 -> 0.180 ms,
    Gemma's int4-channel-key winner pair 0.115 -> 0.088. kivi2 keeps it (0.249 ms with, 0.266 without)."""
    return not (kcodec in (KC4, KF4, KC3, KT4, KT3) and D >= 256)


def why_not(q: torch.Tensor, kv: PagedKV, config: GluonDecodeConfig) -> str | None:
    """None when this kernel runs the call (full-precision window / sink tokens included); else why not."""
    return unsupported(kv.k_spec, kv.v_spec, q.shape[-1], kv.page_size, q.shape[1] // kv.n_kv_heads, q.device,
                       config.tokens_per_warp)


def run(q, kv: PagedKV, sm_scale: float, config: GluonDecodeConfig, out=None, plan: bool = False):
    """Split-K decode through MMA fragments; same contract as the Triton backend's `run` for the calls
    `why_not` accepts. A Hadamard-rotated K rotates q here, a rotated V rotates the output back."""
    B, Hq, D = q.shape
    Hk = kv.n_kv_heads
    group = Hq // Hk
    NW, TW, S = config.num_warps, config.tokens_per_warp, config.num_splits
    k_spec, v_spec = kv.k_spec, kv.v_spec
    kcodec, vcodec = codec_of(k_spec), codec_of(v_spec, "v")
    kchan = kcodec in CHAN
    ks, vs = kv.k_pages.get("scales"), kv.v_pages.get("scales")
    kz, vz = kv.k_pages.get("zeros"), kv.v_pages.get("zeros")
    for name, t in (("K codes", kv.k_pages["codes"]), ("V codes", kv.v_pages["codes"]), ("K scales", ks),
                    ("V scales", vs)):
        if t is None:
            continue
        if not _tile_dense(t):
            raise ValueError(f"{name} must be contiguous within a (page, head) tile; got strides {t.stride()}")
        if max(t.stride()[:2]) * t.element_size() >= 2 ** 31:
            raise ValueError(f"{name}: a page of {t.stride()[0] * t.element_size()} bytes; the Gluon kernel "
                             f"addresses pages with 32-bit strides (allowed: pages under 2 GiB)")
    for name, z, sc in (("K zeros", kz, ks), ("V zeros", vz, vs)):
        if z is not None and z.stride() != sc.stride():
            raise ValueError(f"{name} must have the scales' strides {sc.stride()}; got {z.stride()}")
    if kchan:  # code units of 4 tokens (int4: 2 bytes, int2: 1), scale / zero pairs as int32 words
        kc = kv.k_pages["codes"].view(torch.int16 if k_spec.bits == 4 else torch.uint8)
        ks, kz = ks.view(torch.int32), kz.view(torch.int32)
    else:
        kc = kv.k_pages["codes"].view(torch.int32)
    vc = kv.v_pages["codes"].view(torch.int32)
    ksd, vsd = scale_code(k_spec), scale_code(v_spec)  # nonzero: e8m0 / e4m3 scale bytes, converted in the kernel
    if grouped_k(kcodec, k_spec, D, config, group):
        kcodec = Q4G
    if kivi_folds(kcodec, config, group):
        kcodec = KF4 if kcodec == KC4 else KF2
    if ksd:
        ks = ks.view(torch.uint8)
    if vsd:
        vs = vs.view(torch.uint8)
    WK, WV = (1 if kchan else words_k(kcodec, D)), words_v(vcodec, D)
    lay = layouts(NW, TW, WK, WV, D)
    if out is None:
        out = torch.empty((B, Hq, D), dtype=q.dtype, device=q.device)
    kts, vts = (None if t is None else torch.as_tensor(t, dtype=torch.float32, device=q.device).reshape(1)
                for t in (kv.k_tensor_scale, kv.v_tensor_scale))
    ku = _group(k_spec) if kchan else 1  # tokens a unit of the K tensors (channel-axis keys: a token group)
    read = [(kc, ku), (ks, ku), (kz, ku), (vc, 1), (vs, 1), (vz, 1)]  # the page tensors the codecs read (`l2_parts`)
    ks = kc if ks is None else ks  # codecs without group scales / zeros never read these
    vs = vc if vs is None else vs
    kz = ks if kz is None else kz
    vz = vs if vz is None else vz
    rot_k, rot_v = kv.rotated
    half_q = rot_k and q.dtype in (torch.float16, torch.bfloat16)
    q_scale = sm_scale * LOG2E * (norm_constant(hadamard_block(D)) if half_q else 1.0)
    # full-precision tokens (sinks, window) are attended beside the split merge (`merge_with_fp`), unrotated, so
    # the paged kernel is compiled without them and always writes split partials
    has_fp = kv.has_fp
    user_out = out
    # one split writes the output itself, unless a rotated V is then un-rotated cheaper by the merge kernel
    direct = S == 1 and not has_fp and not (rot_v and fused_unrotation(D))
    fused = S > 1 and config.fused_merge and not has_fp
    # a rotated V is un-rotated by the merge kernels (`fused_unrotation`); a direct or fused-merge output, or a head
    # dim whose rotation is not one block, by a matmul into an fp32 buffer first
    merge_unrotates = rot_v and bool(fused_unrotation(D)) and not direct and not fused
    kern_out = out if not rot_v or has_fp or merge_unrotates else torch.empty((B, Hq, D), dtype=torch.float32,
                                                                              device=q.device)
    op = lse = kern_out  # split partials and their log-sum-exps (unused when direct)
    if not direct:
        op = torch.empty((B, Hq, S, D), dtype=torch.float32, device=q.device)
        lse = torch.empty((B, Hq, S), dtype=torch.float32, device=q.device)
    cnt = counters(q.device, B * Hk) if fused else kern_out
    launch_opts = {} if config.maxnreg is None else {"maxnreg": config.maxnreg}
    perms = channel_orders(kcodec, k_spec.pack, _group(k_spec), vcodec, v_spec.pack, _group(v_spec), q.device, D)
    # fixed codebooks' words once; a calibrated table's (below) from its pages at each launch
    tab = tables(k_spec.fmt if kcodec in TABLES and not k_spec.calibrated else None,
                 v_spec.fmt if vcodec in TABLES and not v_spec.calibrated else None, q.device)
    cal = [(i, pages["codebook"]) for i, (c, spec, pages) in enumerate(((kcodec, k_spec, kv.k_pages),
                                                                         (vcodec, v_spec, kv.v_pages)))
           if c in TABLES and spec.calibrated]
    if cal:
        tab = tab.clone()
        shifts = _byte_shifts(q.device)  # (here: `launch` may run under CUDA graph capture)

    pf = prefetches(kcodec, D) if config.prefetch is None else config.prefetch
    l2 = l2_parts(read, kv.page_size, TW) if config.l2_prefetch else None
    l2kw = {} if l2 is None else dict(L2PF=config.l2_prefetch, PFL=_prefetch_layout(NW, l2["NLP"]), **l2)
    gpn = 8 if group <= 8 else 16  # heads per accumulator (O^T); with 8, the softmax keeps 8 score rows (`_scores`)
    # page strides in units of 16 elements where all are multiples (every dense pool): page offsets are then
    # known multiples of 16, so the compiler keeps the row loads vectorized
    ps = 16 if all(t.stride(0) % 16 == 0 for t in (kc, ks, vc, vs)) else 1

    def launch():
        for i, table in cal:  # a calibrated codebook: its words from the pages' table at each call (and replay)
            tab[8 * i:8 * i + 8] = table_words_of(table, shifts)
        qr = q
        if rot_k:  # scores are invariant: (q H) (k H)^T = q k^T, and the pages hold k H
            # 16-bit q: one tensor-core matmul by the +-1 matrix (exact products, fp32 sums, the 1 / sqrt(block) in
            # the kernel's scale), 3.8 us at Gemma's shape against 8.7 for a cast and an fp32 matmul (H200,
            # sweeps/results/h200/runs/s14a-fixedcost/); the kernel reads q as fp16 either way
            qr = torch.matmul(q, hadamard_signs(D, q.device, q.dtype)) if half_q else q.float() @ hadamard(D, q.device)
        o = kern_out
        _decode_mma_kernel[(B, Hk, S)](
            qr, o, op, lse, cnt, kc, ks, kz, vc, vs, vz, o if kts is None else kts, o if vts is None else vts, *perms,
            tab,
            kv.kv_indptr, kv.kv_indices, kv.kv_last_page_len,
            q_scale, S, qr.stride(0), qr.stride(1), o.stride(0), o.stride(1),
            kc.stride(0) // ps, kc.stride(1), ks.stride(0) // ps, ks.stride(1), vc.stride(0) // ps, vc.stride(1),
            vs.stride(0) // ps, vs.stride(1),
            KCODEC=kcodec, VCODEC=vcodec, WK=WK, WV=WV, GK=_group(k_spec),
            GV=_group(v_spec), HAS_KTS=kts is not None, HAS_VTS=vts is not None, GROUP=group, P=kv.page_size, NW=NW,
            TW=TW, DIRECT=direct, MMA=lay["MMA"], A=lay["A"], B=lay["B"], KW=lay["KW"], VW=lay["VW"],
            VWA=lay["VWA"], OT=config.transpose_o, GPN=gpn, D=D, KCHAN=kchan, KCL=lay["KCL"],
            FUSED=fused, ML=lay["ML"], SR=lay["S8"] if config.transpose_o and gpn == 8 else lay["MMA"], PS=ps,
            KSD=ksd, VSD=vsd, PF=pf, U2=pf and config.unroll, ST=(2 if LAZY_RESCALE else 1) if scores_t(config, group) else 0,
            FT=FULL_TILES, KX=lay["KX"] if kcodec == Q4G else None, KA=lay["A"] if kcodec == Q4G else None,
            num_warps=NW,
            **l2kw, **launch_opts)
        if has_fp:  # the paged partials merged with the full-precision tokens (and un-rotated)
            merge_with_fp(op, lse, q, kv.k_fp, kv.v_fp, kv.fp_len, sm_scale, user_out,
                          v_rot=hadamard(D, q.device) if rot_v else None)
            return user_out
        if not direct and not fused:
            merge_splits(op, lse, o, rotated=merge_unrotates)
        if rot_v and not merge_unrotates:  # the pages hold v H: out H^T
            user_out.copy_(o @ hadamard(D, o.device).T)
        return user_out

    return launch if plan else launch()
