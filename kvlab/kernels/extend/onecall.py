"""One-call extend: the whole prefix and the chunk in one dense attention call with a bottom-right causal mask.

Each sequence's keys and values are written into one workspace [B, Hk, S, D] in the model's own space and natural
channel order: its dequantized pages (tokens 0..L), its full-precision buffer (L..L+F) and its chunk's own keys
(L+F..L+F+C), one Triton launch for the batch (`_workspace_kernel`, the same dequant tiles as every attention kernel,
`tiles.attention.kv_tiles`; a Hadamard spec's tiles are un-rotated in registers, GGML-split columns put back in
order). One attention call then attends the chunk's queries over it with a causal mask aligned to the bottom-right
corner: query i of a C-token chunk over S keys sees keys 0..S-C+i, i.e. the whole prefix and chunk keys 0..i. The
queries and the output keep the model's layout ([C, Hq, D] viewed as [B, Hq, C, D]); nothing is stacked, merged or
un-rotated afterwards.

Why (issue 17): the dense path (`dense.py`) needs three attention-side launches (the prefix non-causal with its
log-sum-exp on stacked queries, the chunk's causal square, a merge), plus the stacking and dequant passes. At batch 1
x 8K its replayed GPU time was ~0.30 ms against cuDNN's 0.23 for the whole call on dense K / V (1.25-1.37x;
`benchmarks/NOTES_extend.md`, session 21). One call over prefix + chunk does the peer's own work plus a memory-bound
workspace pass. torch's cuDNN op cannot: it aligns `is_causal` top-left (aten/src/ATen/native/cudnn/MHA.cpp calls
cudnn-frontend's set_causal_mask), and `causal_lower_right` dispatches to flash (FlashAttention-2: 1.63 ms against
cuDNN's 0.86 at 1K x 32K on the H200). The cuDNN frontend's own graph API (`nvidia-cudnn-frontend`, the optional
extra `kvlab[cudnn]`) sets the diagonal alignment: `sdpa(..., diagonal_alignment=BOTTOM_RIGHT,
diagonal_band_right_bound=0)`, with padding masks (seq_len_q / seq_len_kv device tensors) so that one execution plan
serves every length of a 2048-token bucket (a plan costs 60-250 ms to build) and a CUDA graph of the call replays at
any of them (the lengths are written by the workspace launch from the device's kv_indptr / kv_last_page_len /
fp_len / qo_indptr).

Where it runs: chunks of one length (the model's own prefill; ragged batches keep the dense / fused paths), a
16-bit query (bf16 on the GPU: the workspace and cuDNN run in q's dtype, and an fp16 workspace could overflow where
scales are large), head_dim a multiple of 8 up to 256, rotated specs whose Hadamard block is the whole head
(`fused_unrotation`). On the CPU under the Triton interpreter the workspace launch runs as on the GPU and a float32
masked softmax per sequence stands in for cuDNN (`_attend_emulated`), reading the lengths the launch wrote.
`api.extend(backend="onecall")` runs it (or says why not); backend="auto" tries it first when ENABLED
(KVLAB_EXTEND_ONECALL=1; off: on an H100 it was slower than the dense path at most batch-1 shapes, 1.48-1.67x cuDNN
at 1K x 8K against 1.33-1.44x, `sweeps/results/h100/runs/s30-onecall-d3d2fb3/`; its GPU tests passed there).

Backend contract (called by `api.py` only): `why_not(q, kv, qo_host)`, `run(q, k_new, v_new, qo_indptr, kv, sm_scale,
host_lens, out, bucket)` -> out, or None where the attention call refused the shape (the caller falls back).
"""
from __future__ import annotations

import functools
import os
import warnings

import torch
import triton
import triton.language as tl

from ..env import interpreting
from ..paged import PagedKV, attend
from ..tiles.attention import kv_tiles
from ..tiles.operands import fused_unrotation, slot_args
from ..tiles.permute import to_natural_order
from ..tiles.rotate import fwht_rows
from ...quant.rotation import norm_constant
from .dense import page_inputs, scaled_rows

ENABLED = os.environ.get("KVLAB_EXTEND_ONECALL", "0") not in ("", "0")  # auto tries this path first (slower: off)
BLOCK_T = 64              # workspace tokens per program
MAX_WORKSPACE = 2 << 30   # bytes of K + V workspace a call may take (2 GiB: B 8 x 64K tokens at Hk 8, D 128)
_REFUSED: set = set()     # attention-call keys cuDNN refused: those calls fall back at once


@triton.jit
def _workspace_kernel(WK, WV, SKV, KC, KS, KZ, KL, KPERM, VC, VS, VZ, VL, VPERM, KTS, VTS, IND, INDPTR, LAST,
                      KFP, VFP, FPLEN, KN, VN, QO, SA,
                      kc0, kc1, kc2, kc3, ks0, ks1, ks2, vc0, vc1, vc2, vc3, vs0, vs1, vs2, sw0, sw1, sw2,
                      kf0, kf1, kf2, vf0, vf1, vf2, skn0, skn1, svn0, svn1, KSI, KSV, VSI, VSV, kso0, kso1, vso0, vso1,
                      KCFG: tl.constexpr, VCFG: tl.constexpr, P: tl.constexpr, BT: tl.constexpr, D: tl.constexpr,
                      HAS_KTS: tl.constexpr, HAS_VTS: tl.constexpr, HAS_FP: tl.constexpr, KM: tl.constexpr,
                      KH: tl.constexpr, VM: tl.constexpr, VH: tl.constexpr, KROT: tl.constexpr, VROT: tl.constexpr,
                      RC: tl.constexpr):
    """Workspace tokens t0..t0+BT of sequence n, KV head hk -> WK / WV [n, hk, t, :] (strides sw0, sw1, sw2): the
    dequantized pages for t < L, the full-precision buffer for L <= t < L + F, the chunk's keys / values (KN / VN rows
    QO[n] + j) for L + F <= t < S = L + F + C; zeros from S to SA (the workspace's tokens). Pages' tiles come in the tile column order and, for a
    Hadamard spec, the rotated space: (KM, KH) / (VM, VH) put the columns back in registers (`tiles.permute`; M 0:
    scattered through the perm), KROT / VROT = log2 D un-rotate (`fwht_rows`, H symmetric, RC = 1 / sqrt(D)). The
    program (0, 0, n) writes S to SKV[n] (cuDNN's seq_len_kv)."""
    t0 = tl.program_id(0) * BT
    hk = tl.program_id(1)
    n = tl.program_id(2)
    p0 = tl.load(INDPTR + n).to(tl.int32)
    npg = tl.load(INDPTR + n + 1).to(tl.int32) - p0
    L = tl.where(npg > 0, (npg - 1) * P + tl.load(LAST + n).to(tl.int32), 0)
    F = L * 0
    if HAS_FP:
        F = tl.load(FPLEN + n).to(tl.int32)
    a = tl.load(QO + n).to(tl.int32)
    C = tl.load(QO + n + 1).to(tl.int32) - a
    S = L + F + C
    if (tl.program_id(0) == 0) & (hk == 0):
        tl.store(SKV + n, S)
    WK += n.to(tl.int64) * sw0 + hk * sw1
    WV += n.to(tl.int64) * sw0 + hk * sw1
    t = t0 + tl.arange(0, BT)
    d = tl.arange(0, D)
    if t0 < L:  # [BT, D] tiles of the pages
        kperm = tl.load(KPERM + d)
        vperm = tl.load(VPERM + d)
        kt, v = kv_tiles(WK, KC, KS, KZ, KL, VC, VS, VZ, VL, IND + p0, t0, L, hk, kperm, vperm, kc0, kc1, kc2, kc3,
                         ks0, ks1, ks2, vc0, vc1, vc2, vc3, vs0, vs1, vs2, KCFG, VCFG, P, BT, D, 0, 0, KSI, KSV, VSI,
                         VSV, kso0, kso1, vso0, vso1)  # [D, BT], [BT, D]
        k, v = scaled_rows(kt, v, KTS, VTS, HAS_KTS, HAS_VTS)
        kcol = d
        vcol = d
        if KM == 0:
            kcol = kperm
        else:
            k = to_natural_order(k, BT, D, KM, KH)
        if VM == 0:
            vcol = vperm
        else:
            v = to_natural_order(v, BT, D, VM, VH)
        if KROT > 0:
            k = fwht_rows(k, BT, D, KROT, RC)
        if VROT > 0:
            v = fwht_rows(v, BT, D, VROT, RC)
        tm = (t < L)[:, None]
        tl.store(WK + t[:, None] * sw2 + kcol[None, :], k.to(WK.dtype.element_ty), mask=tm)
        tl.store(WV + t[:, None] * sw2 + vcol[None, :], v.to(WV.dtype.element_ty), mask=tm)
    if t0 + BT > L:  # the buffer and the chunk, in the model's space already; zeros past S
        j = t - L
        fm = (j >= 0) & (j < F)
        jc = j - F
        cm = (jc >= 0) & (jc < C)
        k = tl.load(KN + (a + jc)[:, None] * skn0 + hk * skn1 + d[None, :], mask=cm[:, None], other=0.0)
        v = tl.load(VN + (a + jc)[:, None] * svn0 + hk * svn1 + d[None, :], mask=cm[:, None], other=0.0)
        k = k.to(WK.dtype.element_ty)
        v = v.to(WV.dtype.element_ty)
        if HAS_FP:
            kf = tl.load(KFP + n * kf0 + hk * kf1 + j[:, None] * kf2 + d[None, :], mask=fm[:, None], other=0.0)
            vf = tl.load(VFP + n * vf0 + hk * vf1 + j[:, None] * vf2 + d[None, :], mask=fm[:, None], other=0.0)
            k = tl.where(fm[:, None], kf.to(WK.dtype.element_ty), k)
            v = tl.where(fm[:, None], vf.to(WV.dtype.element_ty), v)
        wm = ((t >= L) & (t < SA))[:, None]  # past S: zeros (cuDNN masks those scores, but a tile that straddles S
        tl.store(WK + t[:, None] * sw2 + d[None, :], k, mask=wm)  # still multiplies its values: 0 x NaN would be NaN)
        tl.store(WV + t[:, None] * sw2 + d[None, :], v, mask=wm)


_WARNED: list = []  # the first exception the auto dispatch caught (`fell_back`)


def fell_back(err: Exception) -> None:
    """The auto dispatch caught `err` from `run` and takes the dense path instead: said once a process as a warning
    (the dense path's result is right; what is lost is the one call's speed)."""
    if not _WARNED:
        _WARNED.append(err)
        warnings.warn(f"extend: the one-call path failed ({err!r}); the auto dispatch falls back to the dense path",
                      RuntimeWarning, stacklevel=3)


@functools.lru_cache(maxsize=1)
def frontend():
    """The cuDNN frontend's Python module (`import cudnn`, package nvidia-cudnn-frontend), or None where it is not
    installed or does not load."""
    try:
        import cudnn  # noqa: PLC0415
    except Exception:  # noqa: BLE001 - absent, or a libcudnn it cannot load: the path is unavailable
        return None
    return cudnn if hasattr(cudnn, "diagonal_alignment") else None


def why_not(q: torch.Tensor, kv: PagedKV, qo_host: list | None) -> str | None:
    """None when the one-call path can run q [C, Hq, D] over `kv` with chunk offsets qo_host (host list); else why
    not."""
    C, Hq, D = q.shape
    if q.is_cuda and interpreting():
        return "the one-call extend does not run CUDA tensors under the Triton interpreter"
    if not q.is_cuda and not interpreting():
        return "the one-call extend needs a CUDA GPU (or TRITON_INTERPRET=1 on the CPU)"
    if q.is_cuda and q.dtype != torch.bfloat16:
        return f"the one-call extend attends in bf16 on the GPU; got a {q.dtype} query"
    if q.is_cuda and frontend() is None:
        return ("the one-call extend needs the cuDNN frontend's Python API (pip install 'kvlab[cudnn]', i.e. "
                "nvidia-cudnn-frontend) for its bottom-right causal mask")
    if D % 8 or D > 256:
        return f"head_dim {D}: the one-call extend takes multiples of 8 up to 256"
    rot_k, rot_v = kv.rotated
    if (rot_k or rot_v) and not fused_unrotation(D):
        return f"head_dim {D} is not one power-of-two Hadamard block: the workspace pass cannot un-rotate it"
    if qo_host is not None:
        lens = [e - a for a, e in zip(qo_host, qo_host[1:])]
        if not lens or lens[0] == 0 or any(n != lens[0] for n in lens):
            return f"the one-call extend takes chunks of one nonzero length; got {lens[:8]}"
        if qo_host[0] != 0 or qo_host[-1] != C:
            return f"the one-call extend takes chunks that cover q's {C} rows exactly; qo_indptr ends at {qo_host[-1]}"
    return None


def workspace_tokens(host_lens, kv: PagedKV, bucket: int) -> int:
    """S, the workspace's tokens per sequence: every prefix rounded up past its bucket (so that the attention plan and a
    graph of the call serve every length of that bucket), plus the buffer's capacity and the chunk."""
    qo, ind, last = host_lens
    P = kv.page_size
    Lmax = max((((ind[b + 1] - ind[b] - 1) * P + last[b]) if ind[b + 1] > ind[b] else 0) for b in range(len(qo) - 1))
    W = kv.k_fp.shape[2] if kv.has_fp else 0
    return (Lmax // bucket + 1) * bucket + W + (qo[1] - qo[0])


def build_workspace(q, k_new, v_new, qo_indptr, kv: PagedKV, S: int, wk=None, wv=None) -> tuple:
    """One launch: every sequence's keys and values (pages, buffer, chunk, then zeros to S) -> (wk, wv [B, Hk, S, D] in
    q's dtype, seq_kv [B] int32: each sequence's tokens). wk / wv: preallocated [B, Hk, S, D] (tests poison them)."""
    D = q.shape[-1]
    B, Hk = qo_indptr.shape[0] - 1, kv.n_kv_heads
    if wk is None:
        wk = torch.empty(B, Hk, S, D, dtype=q.dtype, device=q.device)
        wv = torch.empty_like(wk)
    assert wk.stride() == wv.stride() and wk.stride(-1) == 1, "K and V workspaces share strides, rows contiguous"
    skv = torch.empty(B, dtype=torch.int32, device=q.device)
    K, V = page_inputs(kv, D, q.device)
    rot_k, rot_v = kv.rotated
    rot = fused_unrotation(D)
    BT = max([BLOCK_T] + [s.group for s in (kv.k_spec, kv.v_spec) if s.axis == "chan"])
    has_fp = kv.has_fp
    kf, vf = (kv.k_fp, kv.v_fp) if has_fp else (wk, wk)
    _workspace_kernel[(triton.cdiv(S, BT), Hk, B)](
        wk, wv, skv, K["c"], K["s"], K["z"], K["lut"], K["perm"], V["c"], V["s"], V["z"], V["lut"], V["perm"],
        wk if K["ts"] is None else K["ts"], wk if V["ts"] is None else V["ts"], kv.kv_indices, kv.kv_indptr,
        kv.kv_last_page_len, kf, vf, kv.fp_len if has_fp else skv, k_new, v_new, qo_indptr, wk.shape[2],
        *K["cs"], *K["ss"], *V["cs"], *V["ss"], wk.stride(0), wk.stride(1), wk.stride(2),
        *(kf.stride()[:3] if has_fp else (0, 0, 0)), *(vf.stride()[:3] if has_fp else (0, 0, 0)),
        k_new.stride(0), k_new.stride(1), v_new.stride(0), v_new.stride(1), *slot_args(K, V),
        KCFG=K["cfg"], VCFG=V["cfg"], P=kv.page_size, BT=BT, D=D, HAS_KTS=K["ts"] is not None,
        HAS_VTS=V["ts"] is not None, HAS_FP=has_fp, KM=K["pm"][0], KH=K["pm"][1], VM=V["pm"][0], VH=V["pm"][1],
        KROT=rot if rot_k else 0, VROT=rot if rot_v else 0, RC=norm_constant(D) if rot else 1.0, num_warps=4)
    return wk, wv, skv


def _attend_emulated(q4, wk, wv, skv, sm_scale: float, o4) -> None:
    """cuDNN's call on the CPU: per sequence n, the first skv[n] workspace tokens, float32, query i seeing keys
    0..skv[n] - C + i; into o4 [B, Hq, C, D]."""
    B, Hq, C, D = q4.shape
    for n in range(B):
        S = int(skv[n])
        i = torch.arange(C)[:, None]
        j = torch.arange(S)[None, :]
        o = attend(q4[n].transpose(0, 1), wk[n, :, :S].float(), wv[n, :, :S].float(), sm_scale,
                   (j <= S - C + i)[None])  # [C, Hq, D]
        o4[n] = o.transpose(0, 1).to(o4.dtype)


_HANDLES: dict = {}   # device index -> cuDNN handle
_GRAPHS: dict = {}    # attention-call key -> (cuDNN graph, its tensors, workspace bytes)


def _graph(cudnn, key, q4, wk, skv4, o4, sm_scale: float):
    """The cuDNN graph of one attention-call shape (built once: dims, strides, dtype, scale)."""
    ent = _GRAPHS.get(key)
    if ent is not None:
        return ent
    dev = q4.device.index if q4.device.index is not None else torch.cuda.current_device()
    handle = _HANDLES.get(dev)
    if handle is None:
        with torch.cuda.device(dev):
            handle = _HANDLES[dev] = cudnn.create_handle()
    dt = cudnn.data_type.BFLOAT16 if q4.dtype == torch.bfloat16 else cudnn.data_type.HALF
    g = cudnn.pygraph(io_data_type=dt, intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT, handle=handle)
    tq = g.tensor(name="q", dim=list(q4.shape), stride=list(q4.stride()), data_type=dt)
    tk = g.tensor(name="k", dim=list(wk.shape), stride=list(wk.stride()), data_type=dt)
    tv = g.tensor(name="v", dim=list(wk.shape), stride=list(wk.stride()), data_type=dt)
    tsq = g.tensor(name="seq_q", dim=list(skv4.shape), stride=[1, 1, 1, 1], data_type=cudnn.data_type.INT32)
    tskv = g.tensor(name="seq_kv", dim=list(skv4.shape), stride=[1, 1, 1, 1], data_type=cudnn.data_type.INT32)
    to, _ = g.sdpa(name="extend", q=tq, k=tk, v=tv, generate_stats=False, attn_scale=float(sm_scale),
                   use_padding_mask=True, seq_len_q=tsq, seq_len_kv=tskv,
                   diagonal_alignment=cudnn.diagonal_alignment.BOTTOM_RIGHT, diagonal_band_right_bound=0)
    to.set_output(True).set_dim(list(o4.shape)).set_stride(list(o4.stride())).set_data_type(dt)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    ent = _GRAPHS[key] = (g, (tq, tk, tv, tsq, tskv, to), max(1, g.get_workspace_size()), handle)
    return ent


def _call_key(q4, ws_shape: tuple, o4, sm_scale: float) -> tuple:
    """What a cuDNN graph of the attention call is built for: shapes, strides, dtype, scale, device and the 16-byte
    alignment of q and out (a plan built for aligned pointers is not taken for others)."""
    return (str(q4.device), tuple(q4.shape), q4.stride(), ws_shape, o4.stride(), q4.dtype, float(sm_scale),
            q4.data_ptr() % 16 == 0, o4.data_ptr() % 16 == 0)


def _attend_cudnn(q4, wk, wv, skv, sm_scale: float, o4, key: tuple) -> bool:
    """The cuDNN frontend's SDPA with padding masks and the bottom-right causal diagonal into o4; False where cuDNN
    refused the shape (remembered under `key`, `_call_key`)."""
    cudnn = frontend()
    B, Hq, C, D = q4.shape
    try:
        g, (tq, tk, tv, tsq, tskv, to), nbytes, handle = _graph(cudnn, key, q4, wk, skv.view(B, 1, 1, 1), o4,
                                                                 sm_scale)
    except Exception:  # noqa: BLE001 - cudnnGraphNotSupportedError and friends: this shape falls back
        _REFUSED.add(key)
        return False
    sq = torch.full((B, 1, 1, 1), C, dtype=torch.int32, device=q4.device)
    work = torch.empty(nbytes, dtype=torch.uint8, device=q4.device)
    try:
        cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream(q4.device).cuda_stream)
        g.execute({tq: q4, tk: wk, tv: wv, tsq: sq, tskv: skv.view(B, 1, 1, 1), to: o4}, work, handle=handle)
    except Exception:  # noqa: BLE001 - an execution cuDNN refuses (before it launches): this shape falls back
        _REFUSED.add(key)
        return False
    return True


def run(q, k_new, v_new, qo_indptr, kv: PagedKV, sm_scale: float, host_lens, out=None,
        bucket: int = 2048) -> torch.Tensor | None:
    """Extend through one workspace launch and one attention call (see the module docstring); host_lens: the checked
    host lengths (chunks of one length, `why_not`). Returns out ([C, Hq, D] in q.dtype; allocated when None), or None
    where cuDNN refused the attention's shape (nothing was written to out)."""
    Ct, Hq, D = q.shape
    B, Hk = qo_indptr.shape[0] - 1, kv.n_kv_heads
    C = host_lens[0][1] - host_lens[0][0]
    S = workspace_tokens(host_lens, kv, bucket)
    if 2 * B * Hk * S * D * q.element_size() > MAX_WORKSPACE:
        return None
    direct = out is not None and out.stride(-1) == 1
    o = out if direct else torch.empty_like(q)
    q4 = q.unflatten(0, (B, C)).transpose(1, 2)  # [B, Hq, C, D] views of the model's [B C, Hq, D]
    o4 = o.unflatten(0, (B, C)).transpose(1, 2)
    key = _call_key(q4, (B, Hk, S, D), o4, sm_scale)
    if key in _REFUSED:  # cuDNN refused this shape before: no workspace pass
        return None
    wk, wv, skv = build_workspace(q, k_new, v_new, qo_indptr, kv, S)
    if not q.is_cuda:
        _attend_emulated(q4, wk, wv, skv, sm_scale, o4)
    elif not _attend_cudnn(q4, wk, wv, skv, sm_scale, o4, key):
        return None
    if out is not None and not direct:
        out.copy_(o)
        return out
    return o
