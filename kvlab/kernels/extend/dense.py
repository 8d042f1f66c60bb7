"""Dense-prefix extend: the bulk of a quantized prefix is dequantized once per sequence into a bf16 /
fp16 workspace and attended by the GPU's dense attention (cuDNN, else flash), which returns the
softmax's log-sum-exp. The chunks' causal parts are attended apart (`attend_chunks`: one batched cuDNN
call for equal chunks, else flash varlen) with theirs. `triton.run` then merges the states: where every
sequence's prefix was covered, one light launch (`_merge_kernel`) that also attends the full-precision
buffer; otherwise the fused Triton extend kernel continues from the prefix's state over the rest (the
prefix's last partial bucket, the buffer, the chunk). Sequences with short chunks or prefixes stay
wholly with the fused kernel, in the same launch.

Why: prefill is compute-bound, and a dense tensor-core kernel (cuDNN runs wgmma + TMA on Hopper)
reads a 32K-token prefix in the time its math takes, while dequantizing in the inner loop of an
attention kernel competes with that math for issue slots. Dequantizing is a memory-bound pass:
for a 32K x 8 x 128 prefix it writes 134 MB, about 0.04 ms on an H200, against ~0.9 ms of
attention. vLLM's MLA chunked prefill takes the same route (gather + dequantize the cached prefix
into a workspace, then flash attention varlen, merged by LSE).

Every scheme family works: the workspace is written by the shared dequant tiles the decode and
extend kernels use (`tiles.attention.kv_tiles`). A prefix longer than `MAX_PIECE` tokens is
attended in pieces merged by their log-sum-exps, so the workspace stays bounded. Covered sequences of
equal shape share one stacking launch, one dequant launch and one attention call (offsets from one
host table copied once); rows move whole, column orders changed in registers (`tiles.permute`), and a
Hadamard K spec's queries are rotated as they are stacked.

Backend contract (called by `api.py` only): `why_not(q, kv)`, `attend_prefixes(q, qo_indptr, kv, sm_scale, min_rows,
min_prefix, bucket, row_bucket, min_flops, host_lens, ops, rotate_q)` -> None or (covered [B] int32, o0, lse0, rows [B]
int32, complete); `attend_chunks(q, k_new, v_new, qo_indptr, max_qo_len, sm_scale, min_rows, host_qo)` -> None or
(out, lse, lse strides, row_global).
"""
from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from ..env import interpreting
from .graphs import device_table
from ..paged import PagedKV
from ..tiles.attention import kv_tiles
from ..tiles.operands import page_operands, slot_args
from ..tiles.permute import to_tile_order
from ..tiles.rotate import fwht_rows
from ...quant.rotation import norm_constant

MAX_PIECE = 65536  # prefix tokens per workspace piece (2 x Hk x MAX_PIECE x D x 2 bytes: 268 MB at Hk 8, D 128)
BUCKET = 2048      # the dense part covers whole buckets of prefix tokens; the fused kernel reads the rest
ROW_BUCKET = 256   # stacked query rows are zero-padded to a multiple of this
BLOCK_T = 64       # tokens per program of the dequant pass
_ATTN: dict = {}   # (order, device type, D, dtype) -> the dense attention that ran there ("cudnn" / "flash")
ATTN_ORDER = "cudnn,flash"  # tried in this order; KVLAB_DENSE_ATTN overrides (e.g. "flash" for benchmarks)


@triton.jit
def scaled_rows(kt, v, KTS, VTS, HAS_KTS: tl.constexpr, HAS_VTS: tl.constexpr):
    """`kv_tiles`' K^T [D, BT] and V [BT, D] -> float32 rows [BT, D] each, the per-tensor scales applied."""
    k = tl.trans(kt).to(tl.float32)
    v = v.to(tl.float32)
    if HAS_KTS:
        k = k * tl.load(KTS)
    if HAS_VTS:
        v = v * tl.load(VTS)
    return k, v


@triton.jit
def _dequant_kernel(OK, OV, KC, KS, KZ, KL, KPERM, VC, VS, VZ, VL, VPERM, KTS, VTS, IND, IOFF, L,
                    kc0, kc1, kc2, kc3, ks0, ks1, ks2, vc0, vc1, vc2, vc3, vs0, vs1, vs2, son, so0, so1,
                    KSI, KSV, VSI, VSV, kso0, kso1, vso0, vso1,
                    KCFG: tl.constexpr, VCFG: tl.constexpr, P: tl.constexpr, BT: tl.constexpr, D: tl.constexpr,
                    HAS_KTS: tl.constexpr, HAS_VTS: tl.constexpr):
    """Tokens t0..t0+BT of sequence n's pages (ids at IND + IOFF[n]), KV head hk -> OK / OV [n, Hk, L, D] (n stride
    son) in the tiles' column order (column j holds channel perm[j]: the stores stay contiguous 16-byte rows), the
    workspace dtype, per-tensor scales applied. One launch dequantizes every sequence of a batched attention call."""
    t0 = tl.program_id(0) * BT
    hk = tl.program_id(1)
    n = tl.program_id(2)
    IDX = IND + tl.load(IOFF + n)
    OK += n.to(tl.int64) * son
    OV += n.to(tl.int64) * son
    d = tl.arange(0, D)
    kperm = tl.load(KPERM + d)
    vperm = tl.load(VPERM + d)
    kt, v = kv_tiles(OK, KC, KS, KZ, KL, VC, VS, VZ, VL, IDX, t0, L, hk, kperm, vperm, kc0, kc1, kc2, kc3,
                     ks0, ks1, ks2, vc0, vc1, vc2, vc3, vs0, vs1, vs2, KCFG, VCFG, P, BT, D, 0, 0, KSI, KSV, VSI, VSV, kso0, kso1, vso0, vso1)  # [D, BT], [BT, D]
    k, v = scaled_rows(kt, v, KTS, VTS, HAS_KTS, HAS_VTS)
    t = t0 + tl.arange(0, BT)
    tm = (t < L)[:, None]
    tl.store(OK + hk * so0 + t[:, None] * so1 + d[None, :], k.to(OK.dtype.element_ty), mask=tm)
    tl.store(OV + hk * so0 + t[:, None] * so1 + d[None, :], v.to(OV.dtype.element_ty), mask=tm)


@triton.jit
def _stack_kernel(Q, QS, PERM, SA, SC, sq0, sq1, ssn, ss0, ss1, G: tl.constexpr, D: tl.constexpr, BR: tl.constexpr,
                  PM: tl.constexpr, PH: tl.constexpr, ROT: tl.constexpr, RC: tl.constexpr):
    """Queries a..a+Cb of sequence n (a = SA[n], Cb = SC[n]) -> QS [n, Hk, rows_padded, D]: row g x Cb + i of KV head
    hk holds query a + i of head hk x G + g, columns in the K tiles' order (column j = channel PERM[j]); rows past
    G x Cb are zero. (PM, PH): the perm's form (`tiles.permute.perm_kind`): rows load whole and are permuted in
    registers; PM 0 gathers through PERM. ROT = log2 D > 0: rows are rotated first (`fwht_rows`, RC = 1 / sqrt(D);
    the perm of a rotated spec is the identity)."""
    r = tl.program_id(0) * BR + tl.arange(0, BR)  # [BR] stacked rows
    hk = tl.program_id(1)
    n = tl.program_id(2)
    a = tl.load(SA + n)
    Cb = tl.load(SC + n)
    d = tl.arange(0, D)
    rm = r < G * Cb
    g = r // tl.maximum(Cb, 1)
    i = r - g * Cb
    rows = Q + (a + i)[:, None] * sq0 + (hk * G + g)[:, None] * sq1
    if ROT > 0:
        x = tl.load(rows + d[None, :], mask=rm[:, None], other=0.0).to(tl.float32)
        x = to_tile_order(fwht_rows(x, BR, D, ROT, RC), BR, D, PM, PH)
    elif PM == 0:
        x = tl.load(rows + tl.load(PERM + d)[None, :], mask=rm[:, None], other=0.0)
    else:
        x = to_tile_order(tl.load(rows + d[None, :], mask=rm[:, None], other=0.0), BR, D, PM, PH)
    tl.store(QS + n.to(tl.int64) * ssn + hk * ss0 + r[:, None] * ss1 + d[None, :], x.to(QS.dtype.element_ty))


def why_not(q: torch.Tensor, kv: PagedKV) -> str | None:
    """None when the dense-prefix path can run q [C, Hq, D] over `kv` (a CUDA GPU outside the interpreter and a
    16-bit query, or the CPU under the interpreter, where torch's CPU flash attention stands in); else why not."""
    if q.is_cuda and interpreting():
        return "the dense-prefix path does not run CUDA tensors under the Triton interpreter"
    if not q.is_cuda and not interpreting():
        return "the dense-prefix path needs a CUDA GPU (or TRITON_INTERPRET=1 on the CPU)"
    if q.dtype not in (torch.bfloat16, torch.float16) and not (interpreting() and not q.is_cuda):
        return f"the dense-prefix path attends in the query's 16-bit dtype; got {q.dtype}"
    if q.shape[-1] > 256:
        return f"head_dim {q.shape[-1]} > 256: the dense attention kernels stop at 256"
    return None


def page_inputs(kv: PagedKV, D: int, device) -> tuple[dict, dict]:
    """The dequant pass's operands of K and V (as the attention kernels take them)."""
    return (page_operands(kv.k_pages, kv.k_spec, D, False, device, kv.k_tensor_scale),
            page_operands(kv.v_pages, kv.v_spec, D, False, device, kv.v_tensor_scale))


def dequantize_prefix(kv: PagedKV, ops: tuple, b: int, t0: int, n: int, indptr: list, D: int, dtype, device,
                      out=None) -> tuple:
    """Tokens t0..t0+n of sequence b's quantized pages -> (K, V) [Hk, n, D] in `dtype` (t0 a multiple of the
    page), columns in the tiles' order: column j holds channel ops[0]["perm"][j] (K), ops[1]["perm"][j] (V).
    ops: `page_inputs(kv, D, device)`; indptr: kv.kv_indptr as a list; out: (K, V) views to write into (same
    strides)."""
    Hk = kv.n_kv_heads
    if out is None:
        ok = torch.empty(Hk, n, D, dtype=dtype, device=device)
        ov = torch.empty_like(ok)
    else:
        ok, ov = out
    ioff = torch.tensor([indptr[b] + t0 // kv.page_size], dtype=torch.int32, device=device)
    _dequant(kv, ops, ioff, 1, n, D, ok[None], ov[None])
    return ok, ov


def _dequant(kv: PagedKV, ops: tuple, ioff, n_seq: int, n: int, D: int, ok, ov) -> None:
    """The first n tokens of n_seq sequences, from page-list offsets ioff [n_seq] int32 (device) into kv_indices, ->
    ok / ov [n_seq, Hk, >= n, D] (one launch)."""
    if not n:
        return
    K, V = ops
    Hk = kv.n_kv_heads
    BT = max([BLOCK_T] + [s.group for s in (kv.k_spec, kv.v_spec) if s.axis == "chan"])
    assert ok.stride() == ov.stride(), "K and V workspaces share strides"
    # (the first argument of kv_tiles is the query, read only for its dtype on row-first tiles: unused here)
    _dequant_kernel[(triton.cdiv(n, BT), Hk, n_seq)](
        ok, ov, K["c"], K["s"], K["z"], K["lut"], K["perm"], V["c"], V["s"], V["z"], V["lut"], V["perm"],
        ok if K["ts"] is None else K["ts"], ok if V["ts"] is None else V["ts"], kv.kv_indices, ioff, n,
        *K["cs"], *K["ss"], *V["cs"], *V["ss"], ok.stride(0), ok.stride(1), ok.stride(2), *slot_args(K, V),
        KCFG=K["cfg"], VCFG=V["cfg"], P=kv.page_size, BT=BT, D=D, HAS_KTS=K["ts"] is not None,
        HAS_VTS=V["ts"] is not None, num_warps=4)


def attend_dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float) -> tuple:
    """Non-causal attention with its log-sum-exp: q [(n,) H, M, D], k / v [(n,) H, N, D] (same n and H) ->
    (out [(n,) H, M, D] in q.dtype, lse [(n,) H, M] float32, natural log). The first of KVLAB_DENSE_ATTN / ATTN_ORDER
    that runs ("cudnn", "flash"); on the CPU, torch's CPU flash attention."""
    if q.dim() == 4:  # a batch of sequences of equal shape: one call
        n, H, M, D = q.shape
        q4, k4, v4 = q, k, v
    else:
        n = 0
        H, M, D = q.shape
        q4, k4, v4 = q[None], k[None], v[None]
    lead = (n,) if n else ()
    if not q.is_cuda:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q4, k4, v4, 0.0, False, scale=sm_scale)[:2]
        return out.reshape(*lead, H, M, D), lse.reshape(*lead, H, M)
    order = tuple(os.environ.get("KVLAB_DENSE_ATTN", ATTN_ORDER).split(","))
    key = (order, q.device.type, D, q.dtype)
    first = _ATTN.get(key)  # the one that ran last time first, then the rest of the order
    for name in ((first,) if first else ()) + tuple(n for n in order if n != first):
        try:
            if name == "cudnn":
                res = torch.ops.aten._scaled_dot_product_cudnn_attention(q4, k4, v4, None, True, 0.0, False, False,
                                                                          scale=sm_scale)
            else:
                res = torch.ops.aten._scaled_dot_product_flash_attention(q4, k4, v4, 0.0, False, False, scale=sm_scale)
        except RuntimeError:
            continue
        out, lse = res[0], res[1]
        if out.shape != q4.shape or lse.numel() < max(n, 1) * H * M:
            continue
        _ATTN[key] = name
        lse = lse.reshape(max(n, 1), H, -1)[..., :M].float()
        return (out, lse) if n else (out[0], lse[0])
    raise RuntimeError(f"no dense attention kernel runs head_dim {D} in {q.dtype} on {q.device}")


def _stack(q, Hk: int, kops: dict, sa, sc, n_seq: int, rows_padded: int, out, rotate: bool = False) -> None:
    """Chunk queries of n_seq sequences (starts sa [n_seq], lengths sc [n_seq], int32 device tensors) of q [C, Hq, D]
    stacked per KV head for the dense pass into out [n_seq, Hk, rows_padded, D] (contiguous in its last dim): row
    g x Cb + i = query a + i of head hk x G + g, column j = channel kops["perm"][j], zero rows past G x Cb (one
    launch). rotate: each row is rotated first (q H, the fixed-order transform of one power-of-two block)."""
    D = q.shape[-1]
    G = q.shape[1] // Hk
    BR = 32
    pm, ph = kops["pm"]
    rot = D.bit_length() - 1 if rotate else 0
    _stack_kernel[(triton.cdiv(rows_padded, BR), Hk, n_seq)](
        q, out, kops["perm"], sa, sc, q.stride(0), q.stride(1), out.stride(0), out.stride(1), out.stride(2),
        G=G, D=D, BR=BR, PM=pm, PH=ph, ROT=rot, RC=norm_constant(D) if rot else 1.0, num_warps=4)


CHUNK_MIN_ROWS = 128  # auto: the longest chunk's (query, head) rows per KV head from which flash does the causal part
_NO_FLASH: set = set()  # (device type, D, dtype) where the varlen flash call raised: the fused kernel keeps the chunk


def attend_chunks(q, k_new, v_new, qo_indptr, max_qo_len: int, sm_scale: float, min_rows: int = 0,
                  host_qo=None, cudnn_min_flops: float | None = None):
    """The chunks' causal self-attention, all sequences in one varlen call, with its log-sum-exp, for the fused
    kernel to merge (`triton.run(chunk=...)`): key j of a chunk is visible to its query i when j <= i.

    q [C, Hq, D], k_new / v_new [C, Hk, D] (rotated already where the specs are), qo_indptr [B+1]. On a GPU: chunks
    of one length (host_qo) costing cudnn_min_flops (default CUDNN_CHUNK_MIN_FLOPS) or more in one batched cuDNN call
    (`_cudnn_chunks`), else
    torch's flash attention (varlen, GQA native, 16-bit: bf16 unless all three are fp16); on the CPU (interpreter tests):
    torch's CPU flash attention per sequence in q's dtype. Returns None where it does not run (the longest chunk
    below `min_rows` (query, head) rows per KV head, a head_dim flash does not take, a failed flash call), else
    (out [C, Hq, D] natural channel order, lse float32 natural log, (stride_b, stride_h, stride_row), row_global):
    the log-sum-exp of query i of sequence b, head h, lies at b x stride_b + h x stride_h + r x stride_row, with
    r = qo[b] + i when row_global else i."""
    C, Hq, D = q.shape
    Hk = k_new.shape[1]
    G = Hq // Hk
    cudnn_min_flops = CUDNN_CHUNK_MIN_FLOPS if cudnn_min_flops is None else cudnn_min_flops
    if C == 0 or max_qo_len * G < min_rows or D % 8 or D > 256:
        return None
    if not q.is_cuda:
        qo = host_qo if host_qo is not None else qo_indptr.tolist()
        out = torch.empty_like(q)
        lse = torch.full((Hq, C), float("-inf"), dtype=torch.float32)
        for a, e in zip(qo, qo[1:]):
            if e > a:
                qq = q[a:e].transpose(0, 1)[None]
                kk, vv = (t[a:e].to(q.dtype).repeat_interleave(G, dim=1).transpose(0, 1)[None] for t in (k_new, v_new))
                o, l = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qq, kk, vv, 0.0, True,
                                                                                   scale=sm_scale)[:2]
                out[a:e] = o[0].transpose(0, 1)
                lse[:, a:e] = l.reshape(Hq, e - a)
        return out, lse, (0, lse.stride(0), lse.stride(1)), True
    dt = torch.float16 if q.dtype == k_new.dtype == v_new.dtype == torch.float16 else torch.bfloat16
    key = (q.device.type, D, dt)
    if host_qo is not None and (D, dt) not in _NO_CUDNN_CHUNK:
        nb = len(host_qo) - 1
        cb = host_qo[1] - host_qo[0] if nb else 0
        if nb and cb and host_qo[-1] == nb * cb == C and all(e - a == cb for a, e in zip(host_qo, host_qo[1:])) \
                and 2 * nb * cb * cb * Hq * D >= cudnn_min_flops:
            res = _cudnn_chunks(q, k_new, v_new, nb, cb, sm_scale, dt)
            if res is not None:
                return res
    if key in _NO_FLASH:
        return None
    qq, kk, vv = (t.to(dt) if t.stride(-1) == 1 else t.to(dt).contiguous() for t in (q, k_new, v_new))
    cu = qo_indptr.to(torch.int32)
    try:
        out, lse = torch.ops.aten._flash_attention_forward(qq, kk, vv, cu, cu, max_qo_len, max_qo_len, 0.0, True,
                                                            False, scale=sm_scale)[:2]
    except RuntimeError:
        _NO_FLASH.add(key)
        return None
    if lse.dim() == 2:  # [Hq, C]: FlashAttention's unpadded layout
        return out, lse, (0, lse.stride(0), lse.stride(1)), True
    return out, lse, (lse.stride(0), lse.stride(1), lse.stride(2)), False  # [B, Hq, max_qo_len]


# chunks of equal length (known on the host) whose causal part costs at least this (2 x B x C^2 x Hq x D) go through
# one batched cuDNN call instead of flash varlen: flash ran B 8 x 1,024 x Hq 32 in 0.336 ms (205 TFLOP/s,
# runs/s16b-5ee5d62), a fifth of the call; at batch 1 (8.6e9) the extra host time of cuDNN's op outweighs its gain
# (inside a CUDA graph host time is replayed away: api.GRAPH_CUDNN_CHUNK_MIN_FLOPS)
CUDNN_CHUNK_MIN_FLOPS = 2e10
_NO_CUDNN_CHUNK: set = set()  # (D, dtype) where the cuDNN chunk call raised: flash keeps the chunk


def _cudnn_chunks(q, k_new, v_new, nb: int, cb: int, sm_scale: float, dt):
    """The causal self-attention of nb chunks of cb tokens each in one cuDNN call (square, so its top-left causal
    mask is the chunk's), GQA heads expanded to Hq where cuDNN does not take them as they are; None where it raises.
    Returns attend_chunks' tuple with the padded [B, Hq, cb] log-sum-exp layout."""
    C, Hq, D = q.shape
    G = Hq // k_new.shape[1]

    def bhsd(t):  # [C, H, D] -> [nb, H, cb, D] view (sequence-major memory, as the model's tensors lie)
        return t.to(dt).reshape(nb, cb, t.shape[1], D).transpose(1, 2)
    for expand in (False, True):
        kk, vv = (t.repeat_interleave(G, dim=1) if expand and G > 1 else t for t in (k_new, v_new))
        if expand and G == 1:
            break
        try:
            res = torch.ops.aten._scaled_dot_product_cudnn_attention(bhsd(q), bhsd(kk), bhsd(vv), None, True, 0.0,
                                                                      True, False, scale=sm_scale)
        except RuntimeError:
            continue
        out, lse = res[0], res[1]
        if tuple(out.shape) != (nb, Hq, cb, D) or lse.numel() < nb * Hq * cb:
            continue
        out = out.transpose(1, 2).reshape(C, Hq, D)  # a view where cuDNN kept q's layout
        lse = lse.reshape(nb, Hq, -1)[..., :cb].float()
        return out, lse, (lse.stride(0), lse.stride(1), lse.stride(2)), False
    _NO_CUDNN_CHUNK.add((D, dt))
    return None


def _merge(o, lse, o2, lse2):
    """Two partial attentions over disjoint keys -> one (out fp32, lse); NaN stays NaN."""
    m = torch.maximum(lse, lse2)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w1, w2 = torch.exp(lse - m), torch.exp(lse2 - m)
    tot = w1 + w2
    out = (o.float() * w1[..., None] + o2.float() * w2[..., None]) / tot[..., None]
    return out, m + torch.log(tot)


def _host_lists(qo_indptr, kv: PagedKV) -> tuple[list, list, list]:
    """qo_indptr, kv_indptr, kv_last_page_len as Python lists through one device-to-host copy."""
    parts = [qo_indptr, kv.kv_indptr, kv.kv_last_page_len]
    flat = torch.cat([t.to(torch.int64) for t in parts]).tolist()
    n0, n1 = parts[0].shape[0], parts[1].shape[0]
    return flat[:n0], flat[n0:n0 + n1], flat[n0 + n1:]


def _groups(covered: list, qo: list, G: int, row_bucket: int, piece: int) -> list[list[int]]:
    """Covered sequences in attention calls: those with the same covered length and padded row count share one batched
    call while the group's workspace stays within `piece` tokens; a prefix longer than `piece` goes alone (in
    pieces)."""
    groups, open_ = [], {}
    for b, cov in enumerate(covered):
        if not cov:
            continue
        key = (cov, -(-G * (qo[b + 1] - qo[b]) // row_bucket))
        g = open_.get(key)
        if g is None or (len(g) + 1) * cov > piece:
            g = open_[key] = []
            groups.append(g)
        g.append(b)
    return groups


def attend_prefixes(q, qo_indptr, kv: PagedKV, sm_scale: float, min_rows: int = 128, min_prefix: int = 512,
                    bucket: int = BUCKET, row_bucket: int = ROW_BUCKET, min_flops: float = 0.0, host_lens=None,
                    ops=None, rotate_q: bool = False):
    """The dense part of extend: for each sequence whose chunk has at least `min_rows` (query, head) rows per KV head,
    whose pages hold at least max(min_prefix, bucket) tokens and whose prefix attention costs at least `min_flops`
    (4 x Hq x chunk x prefix x D), its chunk's queries (the G heads of a KV head
    stacked as rows, zero-padded to a multiple of `row_bucket`) attend the first covered = L // bucket x bucket tokens
    of its pages, dequantized into a workspace, non-causally with the log-sum-exp. Lengths come in buckets so that
    cuDNN, which builds a plan per shape (60-250 ms each on the H200), reuses its plans across a prefill's chunks.

    q [C, Hq, D] (rotated already for Hadamard K specs). Returns None when no sequence qualifies, else
    (covered [B] int32, o0 [..., Hk, R, D] in V's tile column order, lse0 [..., Hk, R] float32 natural log, rows [B]
    int32, complete), both int32 tensors on q's device: stacked row g x C_b + i of sequence b (query i, head hk x G + g)
    lies at row rows[b] + g x C_b + i of o0[..., hk, :, :] / lse0[..., hk, :], counting rows through the leading
    dims (o0 and lse0 are contiguous); rows of sequences not covered are not set. Covered sequences of equal shape
    attend in one batched call, and the state is returned where that call (or a lone sequence's) left it; only
    several groups are copied into one buffer. complete: every sequence's whole prefix is covered (the fused kernel
    then reads no page). The fused kernel reads the rest (`triton.run(prefix=...)`).
    host_lens: (qo_indptr, kv_indptr, kv_last_page_len) as host lists (checked by the caller), else read back from
    the device (one synchronization). ops: `page_inputs(kv, D, q.device)` when the caller has them. rotate_q: q is in
    the model's space and a Hadamard K spec (one power-of-two block) wants q H: the stacking rotates it."""
    C, Hq, D = q.shape
    Hk = kv.n_kv_heads
    G = Hq // Hk
    qo, indptr, last = host_lens if host_lens is not None else _host_lists(qo_indptr, kv)
    P = kv.page_size
    B = len(qo) - 1
    covered = [0] * B
    lens = [0] * B
    for b in range(B):
        a, e = qo[b], qo[b + 1]
        n_pages = indptr[b + 1] - indptr[b]
        L = lens[b] = (n_pages - 1) * P + last[b] if n_pages else 0
        if e > a and (e - a) * G >= min_rows and L >= max(min_prefix, bucket, 1) and 4 * Hq * (e - a) * L * D >= min_flops:
            covered[b] = L // bucket * bucket
    if not any(covered):
        return None
    # bf16 on the GPU whatever q's dtype (an fp16 workspace could overflow where the scales are large); q's own dtype
    # on the CPU (the interpreter tests check float32 exactness)
    adt = torch.bfloat16 if q.is_cuda else q.dtype
    unit = P * bucket // math.gcd(P, bucket)  # pieces start on a page and a bucket boundary
    piece = max(unit, MAX_PIECE // unit * unit)
    ops = page_inputs(kv, D, q.device) if ops is None else ops
    groups = _groups(covered, qo, G, row_bucket, piece)
    # the host plan, copied to the device at once: per group, its members' query starts and lengths (stacking) and
    # page-list offsets (dequant; a lone sequence's pieces one each), then covered[B] and rows[B]
    tab, at = [], []
    rows = [0] * B
    for grp in groups:
        rp = -(-G * (qo[grp[0] + 1] - qo[grp[0]]) // row_bucket) * row_bucket
        starts = [qo[b] for b in grp]
        pieces = [indptr[b] for b in grp] if len(grp) > 1 else [indptr[grp[0]] + t0 // P
                                                                for t0 in range(0, covered[grp[0]], piece)]
        at.append((len(tab), rp))
        tab += starts + [qo[b + 1] - qo[b] for b in grp] + pieces
        for i, b in enumerate(grp):
            rows[b] = i * Hk * rp if len(groups) == 1 else G * qo[b]
    n0 = len(tab)
    tab += covered + rows
    dev = device_table(tab, q.device)  # one copy, no synchronization (kept by a graph being built)
    o0 = lse0 = None
    if len(groups) > 1:
        o0 = torch.empty(Hk, G * C, D, dtype=adt, device=q.device)
        lse0 = torch.empty(Hk, G * C, dtype=torch.float32, device=q.device)
    for grp, (t, rp) in zip(groups, at):
        n, cov = len(grp), covered[grp[0]]
        qs = torch.empty(n, Hk, rp, D, dtype=adt, device=q.device)
        _stack(q, Hk, ops[0], dev[t:], dev[t + n:], n, rp, qs, rotate_q)
        if n > 1:  # equal shapes: one batched attention call (cuDNN's host cost is paid once)
            k = torch.empty(n, Hk, cov, D, dtype=adt, device=q.device)
            v = torch.empty_like(k)
            _dequant(kv, ops, dev[t + 2 * n:], n, cov, D, k, v)
            o, lse = attend_dense(qs, k, v, sm_scale)
        else:
            o = lse = None
            for j, t0 in enumerate(range(0, cov, piece)):
                m = min(piece, cov - t0)
                k = torch.empty(1, Hk, m, D, dtype=adt, device=q.device)
                v = torch.empty_like(k)
                _dequant(kv, ops, dev[t + 2 + j:], 1, m, D, k, v)  # tile column order
                op, lp = attend_dense(qs, k, v, sm_scale)
                o, lse = (op, lp) if o is None else _merge(o, lse, op, lp)
        o, lse = o.contiguous(), lse.contiguous()
        if len(groups) == 1:  # the kernel reads the state where the attention left it
            o0, lse0 = o, lse
            break
        for i, b in enumerate(grp):
            a, e = qo[b], qo[b + 1]
            o0[:, G * a:G * e] = o[i, :, :G * (e - a)]
            lse0[:, G * a:G * e] = lse[i, :, :G * (e - a)]
    complete = all(c == n or qo[b + 1] == qo[b] for b, (c, n) in enumerate(zip(covered, lens)))
    return dev[n0:n0 + B], o0, lse0, dev[n0 + B:n0 + 2 * B], complete
