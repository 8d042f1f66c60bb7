"""Triton extend (chunked prefill) attention: a chunk of new queries per sequence attends the
quantized paged prefix, the full-precision buffer, and the chunk's own full-precision keys
(causal within the chunk). One program per (sequence, query block, KV head); rows of a block
are (query, GQA head) pairs, so each K/V tile is dequantized once for the whole group.

Backend contract (called by `api.py` only): `why_not(q, kv, config)`, `run(q, k_new, v_new, qo_indptr, kv,
sm_scale, config, max_qo_len, out)`.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..configs import ExtendConfig
from ..env import poisoned
from ...quant.rotation import hadamard, norm_constant
from ..paged import PagedKV, rotate_inputs
from ..tiles.attention import fp_tile, kv_tiles, q_operand, softmax_step, tensor_scales
from ..tiles.operands import LOG2E, dot_mode, fused_unrotation, page_operands, slot_args, unsupported
from ..tiles.permute import to_natural_order
from ..tiles.rotate import fwht_rows


LOG2E_ = tl.constexpr(LOG2E)
_SIDE: dict = {}  # device -> the side stream the chunk's attention runs on beside the prefix (`overlap_chunk`)


def overlap_chunk() -> bool:
    """With a dense prefix and a dense chunk, the chunk's causal attention runs on a side stream while the prefix's
    stacking, dequant and cuDNN passes run on the caller's (inside a CUDA graph: two branches). On by default: on the
    H200 it took batch 1 x 8K from 1.24-1.36x cuDNN (median 1.29) to 1.19-1.31x (1.23) and D 256 x 8K from a median
    1.33-1.34x to 1.22-1.24x, the rest within the spread between runs (sweeps/results/h200/runs/s35-ab-51b9ae0,
    close2-51b9ae0, s35-ov-51b9ae0; benchmarks/NOTES_extend.md, session 35). KVLAB_EXTEND_OVERLAP=0 turns it off."""
    return os.environ.get("KVLAB_EXTEND_OVERLAP", "1").lower() not in ("", "0", "off", "false", "no")


def overlapped(device, main_fn, side_fn, after_main: bool = False):
    """(main_fn(), side result, whether the side ran): main_fn on the caller's stream, side_fn on a side stream forked
    from the caller's before main_fn's launches, so the two run together on the device. With after_main, side_fn is
    called with main_fn's result after main_fn returns and gives the callable to run (None: nothing runs beside),
    which lets main_fn's host-side plan decide (its launches are already queued; the side work still depends only on
    the fork point). The caller's stream then waits for the side one (also when either raises), and the side
    result's tensors are marked used on the caller's stream (the caching allocator must not hand their memory to
    the side stream again before the caller is done)."""
    main = torch.cuda.current_stream(device)
    side = _SIDE.get(main.device)
    if side is None:
        side = _SIDE[main.device] = torch.cuda.Stream(main.device)
    fork = main.record_event()
    a, forked = None, False
    try:
        if not after_main:
            side.wait_event(fork)
            forked = True
            with torch.cuda.stream(side):
                a = side_fn()
        b = main_fn()
        if after_main:
            fn = side_fn(b)
            if fn is not None:
                side.wait_event(fork)
                forked = True
                with torch.cuda.stream(side):
                    a = fn()
    finally:
        if forked:  # (a side stream that never forked is not part of a capture: no join then)
            main.wait_stream(side)
    for t in (a if isinstance(a, tuple) else ()):
        if isinstance(t, torch.Tensor):
            t.record_stream(main)
    return b, a, forked


@triton.jit
def _merge_state(m_i, l_i, acc, lc, oc):
    """An online-softmax state (m_i base 2, l_i, acc [R, D]) merged with a normalized part over other keys (its base-2
    log-sum-exp lc [R], output oc [R, D]) -> (l_i, acc); NaN in either part stays NaN."""
    m_new = tl.maximum(m_i, lc)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    beta = tl.exp2(lc - m_safe)  # NaN when the chunk's part is NaN: the output row stays NaN
    return l_i * alpha + beta, acc * alpha[:, None] + oc * beta[:, None]


@triton.jit
def _extend_kernel(Q, KN, VN, OUT, QO, KC, KS, KZ, KL, KPERM, VC, VS, VZ, VL, VPERM, KTS, VTS,
                   INDPTR, INDICES, LAST, KFP, VFP, FPLEN, DONE, O0, LSE0, OC, LSEC, qk_scale, ROWS,
                   sq0, sq1, skn0, skn1, svn0, svn1, so0, so1, s00, s01, sl0, sl1, soc0, soc1, slcb, slch, slci,
                   lsec_glob,
                   kc0, kc1, kc2, kc3, ks0, ks1, ks2, vc0, vc1, vc2, vc3, vs0, vs1, vs2, kf0, kf1, kf2, vf0, vf1, vf2,
                   KSI, KSV, VSI, VSV, kso0, kso1, vso0, vso1,
                   KCFG: tl.constexpr, VCFG: tl.constexpr, GROUP: tl.constexpr, QB: tl.constexpr, R: tl.constexpr,
                   D: tl.constexpr, P: tl.constexpr, BN: tl.constexpr, HAS_FP: tl.constexpr, HAS_KTS: tl.constexpr,
                   HAS_VTS: tl.constexpr, DOT: tl.constexpr, HAS_INIT: tl.constexpr, HAS_CHUNK: tl.constexpr):
    b = tl.program_id(0)
    i0 = tl.program_id(1) * QB
    hk = tl.program_id(2)
    q0 = tl.load(QO + b)
    C = tl.load(QO + b + 1) - q0  # chunk length of this sequence
    if i0 < C:
        p0 = tl.load(INDPTR + b)
        p1 = tl.load(INDPTR + b + 1)
        L = tl.where(p1 > p0, (p1 - p0 - 1) * P + tl.load(LAST + b), 0).to(tl.int32)
        T0 = 0  # first prefix token this kernel reads
        if HAS_INIT:  # tokens 0..T0 were attended already (dense.py): start from their (o0, lse0)
            T0 = tl.load(DONE + b)
        IDX = INDICES + p0
        r = tl.arange(0, R)
        qi = i0 + r // GROUP  # [R] query index in the chunk
        heads = hk * GROUP + r % GROUP
        rm = (r < QB * GROUP) & (qi < C)
        d = tl.arange(0, D)
        kperm = tl.load(KPERM + d)
        vperm = tl.load(VPERM + d)
        kts, vts = tensor_scales(KTS, VTS, HAS_KTS, HAS_VTS)
        q = tl.load(Q + (q0 + qi)[:, None] * sq0 + heads[:, None] * sq1 + kperm[None, :], mask=rm[:, None],
                    other=0.0)
        q = q_operand(q.to(tl.float32) * qk_scale, DOT)  # [R, D]
        m_i = tl.full([R], float("-inf"), tl.float32)
        l_i = tl.zeros([R], tl.float32)
        acc = tl.zeros([R, D], tl.float32)
        if HAS_INIT:
            rd = rm & ((tl.zeros([R], tl.int32) + T0) != 0)  # [R]
            srow = tl.load(ROWS + b) + (r % GROUP) * C + qi  # row of the dense pass's stacked queries
            lse0 = tl.load(LSE0 + hk * sl0 + srow * sl1, mask=rd, other=float("-inf"))  # natural log
            m_i = tl.where(rd, lse0 * LOG2E_, m_i)  # the kernel's scores are in base 2
            l_i = tl.where(rd, 1.0, l_i)
            acc = tl.load(O0 + hk * s00 + srow.to(tl.int64)[:, None] * s01 + d[None, :], mask=rd[:, None],
                          other=0.0).to(tl.float32)  # V's tile order
        for t0 in range(T0, L, BN):  # quantized prefix: visible to every query
            kt, v = kv_tiles(q, KC, KS, KZ, KL, VC, VS, VZ, VL, IDX, t0, L, hk, kperm, vperm, kc0, kc1, kc2, kc3,
                             ks0, ks1, ks2, vc0, vc1, vc2, vc3, vs0, vs1, vs2, KCFG, VCFG, P, BN, D, 0, 0, KSI, KSV, VSI, VSV, kso0, kso1, vso0, vso1)
            valid = (t0 + tl.arange(0, BN)) < L
            m_i, l_i, acc = softmax_step(q, kt, v, valid[None, :], m_i, l_i, acc, kts, vts, DOT)
        if HAS_FP:
            F = tl.load(FPLEN + b)
            for t0 in range(0, F, BN):
                kt, v, fm = fp_tile(KFP, VFP, b, hk, t0, F, kperm, vperm, kf0, kf1, kf2, vf0, vf1, vf2, BN)
                m_i, l_i, acc = softmax_step(q, kt, v, fm[None, :], m_i, l_i, acc, 1.0, 1.0, DOT)
        if HAS_CHUNK:  # the chunk's causal part was attended already (dense.attend_chunks): merge its (out, lse)
            lc = tl.load(LSEC + b * slcb + heads * slch + (qi + q0 * lsec_glob) * slci, mask=rm,
                         other=float("-inf")) * LOG2E_  # [R], base 2 as the kernel's scores
            oc = tl.load(OC + (q0 + qi)[:, None] * soc0 + heads[:, None] * soc1 + vperm[None, :], mask=rm[:, None],
                         other=0.0).to(tl.float32)  # [R, D] in V's tile order
            l_i, acc = _merge_state(m_i, l_i, acc, lc, oc)
        else:
            hi = tl.minimum(C, i0 + QB)  # chunk keys, causal: key j visible to query i when j <= i
            for j0 in range(0, hi, BN):
                j = j0 + tl.arange(0, BN)
                jm = j < hi
                kt = tl.load(KN + (q0 + j)[None, :] * skn0 + hk * skn1 + kperm[:, None], mask=jm[None, :], other=0.0)
                v = tl.load(VN + (q0 + j)[:, None] * svn0 + hk * svn1 + vperm[None, :], mask=jm[:, None], other=0.0)
                valid = jm[None, :] & (j[None, :] <= qi[:, None])
                m_i, l_i, acc = softmax_step(q, kt, v, valid, m_i, l_i, acc, 1.0, 1.0, DOT)
        o = tl.where(l_i[:, None] != 0, acc / tl.where(l_i != 0, l_i, 1.0)[:, None], 0.0)  # NaN stays NaN
        tl.store(OUT + (q0 + qi)[:, None] * so0 + heads[:, None] * so1 + vperm[None, :], o.to(OUT.dtype.element_ty),
                 mask=rm[:, None])


@triton.jit
def _merge_kernel(OUT, QO, DONE, ROWS, O0, LSE0, OC, LSEC, VPERM, Q, KFP, VFP, FPLEN, qk_scale, so0, so1, s00, s01,
                  sl0, sl1, soc0, soc1, slcb, slch, slci, lsec_glob, sq0, sq1, kf0, kf1, kf2, vf0, vf1, vf2,
                  GROUP: tl.constexpr, D: tl.constexpr, BR: tl.constexpr, VM: tl.constexpr, VH: tl.constexpr,
                  ROT: tl.constexpr, RC: tl.constexpr, HAS_FP: tl.constexpr, BNF: tl.constexpr, DOT: tl.constexpr):
    """Every key attended but the full-precision buffer's: the dense prefix's state (o0 in V's tile order, lse0;
    `dense.attend_prefixes`), the buffer's FPLEN[b] tokens (HAS_FP: attended here, BNF at a time, all the rows of a
    program sharing KV head hk's tiles) and the chunk's causal state (oc, lsec; `dense.attend_chunks`) of BR stacked
    rows sr = g x C + i (query i of sequence b, head hk x GROUP + g) -> out. Rows are whole contiguous vectors: o0 goes
    to the natural order in registers ((VM, VH): `tiles.permute.perm_kind`; VM 0: the state stays in V's tile order,
    and oc, the buffer's values and out go through VPERM instead). ROT = log2 D > 0: o0 is of a rotated V (v H) while
    the chunk's state, the queries and the buffer are in the model's own space (`run`): o0 is un-rotated here
    (`fwht_rows`, H symmetric; RC = 1 / sqrt(D))."""
    b = tl.program_id(0)
    sr = tl.program_id(1) * BR + tl.arange(0, BR)
    hk = tl.program_id(2)
    q0 = tl.load(QO + b)
    C = tl.load(QO + b + 1) - q0
    if tl.program_id(1) * BR < GROUP * C:
        g = sr // C
        i = sr - g * C
        rm = sr < GROUP * C
        heads = hk * GROUP + g
        d = tl.arange(0, D)
        rd = rm & (tl.zeros([BR], tl.int32) + tl.load(DONE + b) != 0)  # the sequence's prefix went dense
        row = (tl.load(ROWS + b) + sr).to(tl.int64)
        m_i = tl.load(LSE0 + hk * sl0 + row * sl1, mask=rd, other=float("-inf")) * LOG2E_  # base 2
        l_i = tl.where(rd, 1.0, 0.0)
        acc = tl.load(O0 + hk * s00 + row[:, None] * s01 + d[None, :], mask=rd[:, None], other=0.0).to(tl.float32)
        vcols = d
        if VM == 0:
            vcols = tl.load(VPERM + d)  # the state stays in the tile order; oc / values / out through the perm
        else:
            acc = to_natural_order(acc, BR, D, VM, VH)
        if ROT > 0:
            acc = fwht_rows(acc, BR, D, ROT, RC)
        if HAS_FP:  # scores are invariant to the column order: queries and buffer keys both in the natural one
            q = tl.load(Q + (q0 + i)[:, None] * sq0 + heads[:, None] * sq1 + d[None, :], mask=rm[:, None], other=0.0)
            q = q_operand(q.to(tl.float32) * qk_scale, DOT)  # [BR, D]
            F = tl.load(FPLEN + b)
            for t0 in range(0, F, BNF):
                kt, v, fm = fp_tile(KFP, VFP, b, hk, t0, F, d, vcols, kf0, kf1, kf2, vf0, vf1, vf2, BNF)
                m_i, l_i, acc = softmax_step(q, kt, v, fm[None, :], m_i, l_i, acc, 1.0, 1.0, DOT)
        lc = tl.load(LSEC + b * slcb + heads * slch + (i + q0 * lsec_glob) * slci, mask=rm,
                     other=float("-inf")) * LOG2E_
        oc = tl.load(OC + (q0 + i)[:, None] * soc0 + heads[:, None] * soc1 + vcols[None, :], mask=rm[:, None],
                     other=0.0).to(tl.float32)
        l_i, acc = _merge_state(m_i, l_i, acc, lc, oc)
        o = tl.where(l_i[:, None] != 0, acc / tl.where(l_i != 0, l_i, 1.0)[:, None], 0.0)  # NaN stays NaN
        tl.store(OUT + (q0 + i)[:, None] * so0 + heads[:, None] * so1 + vcols[None, :], o.to(OUT.dtype.element_ty),
                 mask=rm[:, None])


def _launch_merge(out, q, qo_indptr, kv: PagedKV, k_fp, v_fp, init, ch, V: dict, sm_scale: float,
                  config: ExtendConfig, group: int, max_qo_len: int, rot: int) -> None:
    """Launch `_merge_kernel` into out: the dense prefix's state `init`, the buffer k_fp / v_fp (in q's space) and the
    chunk's state `ch`; rot = log2 D un-rotates the prefix's state (a rotated V of fused rotations)."""
    B, Hk = qo_indptr.shape[0] - 1, kv.n_kv_heads
    D = q.shape[-1]
    BR = max(16, 8192 // D)
    vm, vh = V["pm"]
    o0, lse0 = init[1], init[2]
    has_fp = k_fp is not None
    kf, vf = (k_fp, v_fp) if has_fp else (out, out)
    _merge_kernel[(B, triton.cdiv(group * max_qo_len, BR), Hk)](
        out, qo_indptr, init[0], init[3], o0, lse0, ch[0], ch[1], V["perm"], q, kf, vf,
        kv.fp_len if has_fp else qo_indptr, sm_scale * LOG2E, out.stride(0), out.stride(1), o0.stride(-3),
        o0.stride(-2), lse0.stride(-2), lse0.stride(-1), ch[0].stride(0), ch[0].stride(1), *ch[2], int(ch[3]),
        q.stride(0), q.stride(1), *(kf.stride()[:3] if has_fp else (0, 0, 0)),
        *(vf.stride()[:3] if has_fp else (0, 0, 0)), GROUP=group, D=D, BR=BR, VM=vm, VH=vh, ROT=rot,
        RC=norm_constant(D) if rot else 1.0, HAS_FP=has_fp, BNF=16, DOT=dot_mode(config.dot, False), num_warps=4)


def why_not(q: torch.Tensor, kv: PagedKV, config: ExtendConfig) -> str | None:
    """None when this kernel runs the call; else why not."""
    return unsupported(q, kv)


def run(q, k_new, v_new, qo_indptr, kv: PagedKV, sm_scale: float, config: ExtendConfig, max_qo_len=None, out=None,
        prefix=None, chunk=None):
    """Launch the extend kernel; returns [C, Hq, D] in q.dtype (written into `out` when given).

    prefix: None, or a callable (q, (K, V) page operands, rotate_q) -> None | (covered [B] int32, o0, lse0 natural log,
    rows [B] int32, complete) given the queries (rotated already, or to be rotated as it stacks them: rotate_q),
    that attends the first covered[b] prefix tokens of some sequences itself (`dense.attend_prefixes`; complete: it
    covered every sequence's whole prefix); the kernel reads the rest of their prefix, their full-precision buffer and
    chunk, continuing from that softmax state.
    chunk: None, or a callable (q, k_new, v_new, max_qo_len) -> None | (out, lse, lse strides, row_global) given the
    inputs (rotated, or all in the model's space for a merge-only call of fused rotations), that attends every chunk's
    causal part itself (`dense.attend_chunks`); the kernel merges it instead of reading the chunk's keys. With a
    complete prefix and the chunk attended, one light launch merges the two states and attends the full-precision
    buffer (`_merge_kernel`, whole contiguous rows)."""
    Ctot, Hq, D = q.shape
    dtype = q.dtype
    B = qo_indptr.shape[0] - 1
    Hk = kv.n_kv_heads
    group = Hq // Hk
    BN = max([config.block_n] + [s.group for s in (kv.k_spec, kv.v_spec) if s.axis == "chan"])
    K = page_operands(kv.k_pages, kv.k_spec, D, False, q.device, kv.k_tensor_scale)
    V = page_operands(kv.v_pages, kv.v_spec, D, False, q.device, kv.v_tensor_scale)
    rot_k, rot_v = kv.rotated
    # Hadamard specs of one power-of-two block: the dense pass rotates the queries as it stacks them and the merge
    # un-rotates the prefix's output, so a merge-only call attends the chunk in the model's own space (scores and the
    # chunk's output are invariant) and runs no torch matmul; otherwise q / the fp keys and values are rotated here
    fuse = (rot_k or rot_v) and fused_unrotation(D) > 0 and K["pm"][0] > 0 and V["pm"][0] > 0
    k_fp, v_fp = kv.k_fp, kv.v_fp
    if not fuse:  # the pages' space throughout (unrotated specs: unchanged)
        q, (k_fp, k_new), (v_fp, v_new) = rotate_inputs(q, [k_fp, k_new], [v_fp, v_new], kv.k_spec, kv.v_spec, D)
    if max_qo_len is None:
        max_qo_len = int((qo_indptr[1:] - qo_indptr[:-1]).max()) if B else 0
    has_fp = k_fp is not None
    init = ch = None
    tried = False  # the chunk's attention was asked for already (in the model's own space)
    if prefix is not None and chunk is not None and B and max_qo_len and q.is_cuda and overlap_chunk():
        # the chunk beside the prefix, the same call as the sequential path makes below: unrotated specs always (its
        # inputs are final here: queued first); a fused rotation only for a complete prefix's merge-only call, in the
        # model's space, which the prefix's host-side plan decides (otherwise the chunk is attended after the rotation)
        def _beside(init):
            if init is not None and init[4]:
                return lambda: chunk(q, k_new, v_new, max_qo_len)
            return None
        init, ch, tried = overlapped(q.device, lambda: prefix(q, (K, V), fuse and rot_k),
                                     _beside if fuse else (lambda: chunk(q, k_new, v_new, max_qo_len)),
                                     after_main=fuse)
    elif prefix is not None and B and max_qo_len:
        init = prefix(q, (K, V), fuse and rot_k)
    if fuse and init is not None and init[4] and chunk is not None:
        if not tried:
            ch, tried = chunk(q, k_new, v_new, max_qo_len), True
        if ch is not None:  # only the buffer left: merge the states, attend the buffer in the model's space
            if out is None:
                out = poisoned((Ctot, Hq, D), dtype, q.device)
            _launch_merge(out, q, qo_indptr, kv, k_fp, v_fp, init, ch, V, sm_scale, config, group, max_qo_len,
                          fused_unrotation(D) if rot_v else 0)
            return out
    if fuse:  # the fused kernel reads the pages' space
        q, (k_fp, k_new), (v_fp, v_new) = rotate_inputs(q, [k_fp, k_new], [v_fp, v_new], kv.k_spec, kv.v_spec, D)
    user_out = out
    if out is None or rot_v:
        out = poisoned((Ctot, Hq, D), torch.float32 if rot_v else dtype, q.device)
    kf, vf = (k_fp, v_fp) if has_fp else (out, out)
    if chunk is not None and B and max_qo_len and not tried:
        ch = chunk(q, k_new, v_new, max_qo_len)
    if init is not None and init[4] and ch is not None:  # only the buffer left: merge the states, attend the buffer
        _launch_merge(out, q, qo_indptr, kv, k_fp, v_fp, init, ch, V, sm_scale, config, group, max_qo_len, 0)
    elif B and max_qo_len:
        QB = max(1, config.block_m // group)
        R = max(16, triton.next_power_of_2(QB * group))
        _extend_kernel[(B, triton.cdiv(max_qo_len, QB), Hk)](
            q, k_new, v_new, out, qo_indptr, K["c"], K["s"], K["z"], K["lut"], K["perm"], V["c"], V["s"], V["z"],
            V["lut"], V["perm"], out if K["ts"] is None else K["ts"], out if V["ts"] is None else V["ts"],
            kv.kv_indptr, kv.kv_indices, kv.kv_last_page_len, kf, vf, kv.fp_len if has_fp else kv.kv_last_page_len,
            *(init[:3] if init else (qo_indptr, out, out)), *(ch[:2] if ch else (out, out)), sm_scale * LOG2E,
            init[3] if init else qo_indptr, q.stride(0), q.stride(1),
            k_new.stride(0), k_new.stride(1), v_new.stride(0), v_new.stride(1), out.stride(0), out.stride(1),
            *((init[1].stride(-3), init[1].stride(-2), init[2].stride(-2), init[2].stride(-1)) if init
              else (0, 0, 0, 0)),
            *(ch[0].stride()[:2] if ch else (0, 0)), *(ch[2] if ch else (0, 0, 0)), int(ch[3]) if ch else 0,
            *K["cs"], *K["ss"], *V["cs"], *V["ss"], *(kf.stride()[:3] if has_fp else (0, 0, 0)),
            *(vf.stride()[:3] if has_fp else (0, 0, 0)), *slot_args(K, V),
            KCFG=K["cfg"], VCFG=V["cfg"], GROUP=group, QB=QB, R=R, D=D, P=kv.page_size, BN=BN, HAS_FP=has_fp,
            HAS_KTS=K["ts"] is not None, HAS_VTS=V["ts"] is not None, DOT=dot_mode(config.dot, False),
            HAS_INIT=init is not None, HAS_CHUNK=ch is not None,
            num_warps=config.num_warps, num_stages=config.num_stages)
    if rot_v:  # the pages hold v H: out H^T
        out = (out @ hadamard(D, q.device).T).to(dtype)
    if user_out is not None and out is not user_out:
        user_out.copy_(out)
        return user_out
    return out
