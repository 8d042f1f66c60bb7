"""Torch reference for paged decode/extend attention (CPU or GPU, never imports Triton).

Gathers each sequence's pages in block-table order, dequantizes them through the oracle
(`kvlab.dequantize`) and computes float32 attention over [quantized tokens, full-precision tokens].
"""
from __future__ import annotations

import dataclasses

import torch

from ...quant import QTensor, dequantize


def gather_tokens(pages: dict, spec, page_ids: torch.Tensor, n_tokens: int, D: int, P: int,
                  tensor_scale=None) -> torch.Tensor:
    """Dequantized tokens of one sequence: pages[page_ids] -> float32 [Hk, n_tokens, D]."""
    codes = pages["codes"][page_ids.long()]  # [n, Hk, ...]
    n, Hk = codes.shape[0], codes.shape[1]
    if n == 0:
        return torch.zeros(Hk, 0, D, dtype=torch.float32, device=codes.device)
    if spec.is_float_storage:
        return codes.transpose(0, 1).reshape(Hk, n * P, D)[:, :n_tokens].float()
    T = n * P
    sc, ze = pages.get("scales"), pages.get("zeros")
    take = (lambda t: None if t is None else t[page_ids.long()].transpose(0, 1))  # noqa: E731
    sc, ze = take(sc), take(ze)
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
    if spec.axis == "tensor" and spec.has_scale:  # the pool's per-tensor scale, given as its float value
        sc = torch.as_tensor(tensor_scale, dtype=torch.float32, device=codes.device).reshape(())
        spec = dataclasses.replace(spec, scale_dtype="f32")
    if spec.tensor_scale:
        ts = torch.as_tensor(tensor_scale, dtype=torch.float32, device=codes.device).reshape(())
    q = QTensor(codes, sc, ze, ts, spec, (Hk, T, D), torch.float32)
    return dequantize(q)[:, :n_tokens]


def sequence_kv(b: int, k_pages, v_pages, kv_indptr, kv_indices, kv_last_page_len, k_spec, v_spec, P: int, D: int,
                k_fp, v_fp, fp_len, k_tensor_scale, v_tensor_scale):
    """(K, V) float32 [Hk, L_b + F_b, D] of sequence b: dequantized pages then full-precision tokens."""
    p0, p1 = int(kv_indptr[b]), int(kv_indptr[b + 1])
    ids = kv_indices[p0:p1]
    L = (p1 - p0 - 1) * P + int(kv_last_page_len[b]) if p1 > p0 else 0
    k = gather_tokens(k_pages, k_spec, ids, L, D, P, k_tensor_scale)
    v = gather_tokens(v_pages, v_spec, ids, L, D, P, v_tensor_scale)
    if k_fp is not None:
        F = int(fp_len[b])
        k = torch.cat([k, k_fp[b, :, :F].float()], 1)
        v = torch.cat([v, v_fp[b, :, :F].float()], 1)
    return k, v


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float, mask=None) -> torch.Tensor:
    """q [T, Hq, D], k/v [Hk, L, D] -> [T, Hq, D] float32 (GQA: query head h uses KV head h // (Hq/Hk))."""
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
    p = torch.nan_to_num(p, nan=0.0)  # rows with no visible key -> 0
    return torch.einsum("htl,hld->thd", p, vv)


def decode_reference(q, k_pages, v_pages, kv_indptr, kv_indices, kv_last_page_len, k_spec, v_spec, P, *, k_fp,
                     v_fp, fp_len, k_tensor_scale, v_tensor_scale, sm_scale):
    """float32 reference of `kvlab.kernels.decode.decode`; returns [B, Hq, D] in q.dtype."""
    B, Hq, D = q.shape
    out = torch.empty(B, Hq, D, dtype=torch.float32, device=q.device)
    for b in range(B):
        k, v = sequence_kv(b, k_pages, v_pages, kv_indptr, kv_indices, kv_last_page_len, k_spec, v_spec, P, D,
                           k_fp, v_fp, fp_len, k_tensor_scale, v_tensor_scale)
        out[b] = attend(q[b:b + 1], k, v, sm_scale)[0]
    return out.to(q.dtype)
