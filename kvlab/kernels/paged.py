"""`PagedKV`: the quantized prefix every attention op reads, as one checked object, and the torch
helpers that read it back (gather, rotate, attend). No Triton import.

`checks.check_prefix` builds a PagedKV from the public arguments of `decode` / `extend`; the
backends (reference, Triton, Gluon) take it as it is.
"""
from __future__ import annotations

import dataclasses

import torch

from ..quant import QTensor, dequantize
from ..quant.rotation import hadamard
from ..spec import KVQuantSpec


@dataclasses.dataclass(frozen=True)
class PagedKV:
    """A paged, quantized K/V prefix of B sequences (FlashInfer-style CSR block table).

    k_pages, v_pages:  page dicts {"codes", "scales", "zeros"} of `PageLayout(spec, D, page_size, Hk)`
    kv_indptr:         [B+1] int32/64 offsets into kv_indices; kv_indices: page ids in order
    kv_last_page_len:  [B] tokens used in each sequence's last page
    k_fp, v_fp:        [B, Hk, W, D] full-precision tokens (sinks, window, unfinished group), fp_len [B]
    k/v_tensor_scale:  the per-tensor float of specs that need one (`spec.needs_tensor_scale`), else None
    """
    k_pages: dict
    v_pages: dict
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    k_spec: KVQuantSpec
    v_spec: KVQuantSpec
    page_size: int
    k_fp: torch.Tensor | None = None
    v_fp: torch.Tensor | None = None
    fp_len: torch.Tensor | None = None
    k_tensor_scale: object = None
    v_tensor_scale: object = None

    @property
    def batch(self) -> int:
        return self.kv_indptr.shape[0] - 1

    @property
    def n_kv_heads(self) -> int:
        return self.k_pages["codes"].shape[1]

    @property
    def has_fp(self) -> bool:
        return self.k_fp is not None

    @property
    def rotated(self) -> tuple[bool, bool]:
        """(K rotated, V rotated): Hadamard specs, whose pages hold x H."""
        return self.k_spec.rotation == "had", self.v_spec.rotation == "had"


def rotate_inputs(q, ks, vs, k_spec, v_spec, D):
    """Hadamard-rotated specs: q -> q @ H for K (scores are invariant); the full-precision keys / values in
    `ks` / `vs` (lists, None entries kept) are rotated alike so a kernel sees one space; the caller
    un-rotates the output with H^T for V. Returns (q, ks, vs)."""
    if "had" not in (k_spec.rotation, v_spec.rotation):
        return q, ks, vs
    H = hadamard(D, q.device)
    rot = (lambda t: None if t is None else t.float() @ H)  # noqa: E731
    if k_spec.rotation == "had":
        q, ks = rot(q), [rot(t) for t in ks]
    if v_spec.rotation == "had":
        vs = [rot(t) for t in vs]
    return q, ks, vs


def gather_tokens(pages: dict, spec, page_ids: torch.Tensor, n_tokens: int, D: int, P: int,
                  tensor_scale=None) -> torch.Tensor:
    """Dequantized tokens of one sequence through the oracle: pages[page_ids] -> float32 [Hk, n_tokens, D]."""
    codes = pages["codes"][page_ids.long()]  # [n, Hk, ...]
    n, Hk = codes.shape[0], codes.shape[1]
    if n == 0:
        return torch.zeros(Hk, 0, D, dtype=torch.float32, device=codes.device)
    if spec.is_float_storage:
        return codes.transpose(0, 1).reshape(Hk, n * P, D)[:, :n_tokens].float()
    T = n * P
    take = (lambda t: None if t is None else t[page_ids.long()].transpose(0, 1))  # noqa: E731
    sc, ze = take(pages.get("scales")), take(pages.get("zeros"))
    codes = codes.transpose(0, 1)  # [Hk, n, ...]
    if spec.axis == "chan":
        G = spec.group
        codes = codes.reshape(Hk, T // G, D, -1)
        sc = sc.reshape(Hk, T // G, D)
        ze = None if ze is None else ze.reshape(Hk, T // G, D)
    else:
        G = spec.group_size(D)
        codes = codes.reshape(Hk, T, D // G, -1)
        if sc is not None:
            sc, ze = sc.reshape(Hk, T, D // G), None if ze is None else ze.reshape(Hk, T, D // G)
    ts = None
    if spec.static_scale:  # the pool's per-tensor scale, given as its float value
        sc = torch.as_tensor(tensor_scale, dtype=torch.float32, device=codes.device).reshape(())
        spec = dataclasses.replace(spec, scale_dtype="f32")
    if spec.tensor_scale:
        ts = torch.as_tensor(tensor_scale, dtype=torch.float32, device=codes.device).reshape(())
    cb = pages["codebook"][:2 ** spec.bits] if spec.calibrated else None  # a calibrated spec's levels
    oi = ov = None
    if spec.outliers:  # the outlier slots, per token: [Hk, T, N]
        oi, ov = (take(pages[k]).reshape(Hk, T, spec.outliers) for k in ("out_idx", "out_val"))
    q = QTensor(codes, sc, ze, ts, spec, (Hk, T, D), torch.float32, cb, out_idx=oi, out_val=ov)
    return dequantize(q)[:, :n_tokens]


def sequence_kv(kv: PagedKV, b: int, D: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(K, V) float32 [Hk, L_b + F_b, D] of sequence b: dequantized pages, then full-precision tokens."""
    p0, p1 = int(kv.kv_indptr[b]), int(kv.kv_indptr[b + 1])
    ids = kv.kv_indices[p0:p1]
    P = kv.page_size
    L = (p1 - p0 - 1) * P + int(kv.kv_last_page_len[b]) if p1 > p0 else 0
    k = gather_tokens(kv.k_pages, kv.k_spec, ids, L, D, P, kv.k_tensor_scale)
    v = gather_tokens(kv.v_pages, kv.v_spec, ids, L, D, P, kv.v_tensor_scale)
    if kv.has_fp:
        F = int(kv.fp_len[b])
        k = torch.cat([k, kv.k_fp[b, :, :F].float()], 1)
        v = torch.cat([v, kv.v_fp[b, :, :F].float()], 1)
    return k, v


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float, mask=None) -> torch.Tensor:
    """q [T, Hq, D], k/v [Hk, L, D] -> [T, Hq, D] float32 (GQA: query head h uses KV head h // (Hq/Hk)).
    mask: [1 or Hq, T, L] bool, True where a key is visible; rows with no visible key give 0. A NaN score (a
    non-finite key or value) makes its row NaN: it is not dropped as an empty row would be."""
    T, Hq, D = q.shape
    Hk, L = k.shape[0], k.shape[1]
    if L == 0:
        return torch.zeros(T, Hq, D, dtype=torch.float32, device=q.device)
    kk = k.repeat_interleave(Hq // Hk, 0)  # [Hq, L, D]
    vv = v.repeat_interleave(Hq // Hk, 0)
    s = torch.einsum("thd,hld->htl", q.float(), kk) * sm_scale  # [Hq, T, L]
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, -1)
    p = torch.where((s == float("-inf")).all(-1, keepdim=True), torch.zeros_like(p), p)  # nothing visible: 0
    return torch.einsum("htl,hld->thd", p, vv)
