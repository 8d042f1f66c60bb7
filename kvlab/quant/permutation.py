"""Calibrated channel permutations of keys (`perm` on a K spec): reorder key channels before grouping.

A per-token spec groups each key vector's channels in runs of g (channels 0..g-1 share a scale, and so on), so a
group's step is set by its largest channel. Which channels share a group is a free choice as long as the queries
follow: scores are unchanged, q k^T = (q P)(k P)^T for a permutation P of the channels, so the cache stores
k[..., perm] and attention reads the queries as q[..., perm] (one gather per call at the ops' boundary, as key
smoothing folds its factors into the queries; no kernel knows). RPTQ reorders activation channels this way.

The fit minimises a proxy of the score error over calibration keys and queries: a group's rounding error is about
its range squared (max - min per token; 2 max |x| for a symmetric spec) and it reaches the scores through the
query energy of its channels, so the cost of a grouping is sum over groups of mean_t(range_t^2) * sum_c E[q_c^2].
A steepest-descent search swaps channels between groups while the cost falls (start: the identity, so the fit
never costs more than no permutation on calibration text), then keeps the result per KV head only when the real
quantizer's score error on the calibration queries is lower than the identity's.

Sorting channels by magnitude, the obvious reorder, is worse than none on SmolLM2 (it puts the largest key channels,
which meet the largest query channels, under one coarse scale). Keys are post-RoPE, and RoPE moves a pair's energy
between channels c and c + D/2 with position, so a permutation fitted at the calibration text's positions does not
hold far from them: `kvlab.eval.faithful.calibrate` captures the calibration text at positions spread over the
model's context (sweeps/results/quality/permutations/ has the measurements).

Shapes: perm int64 [Hk, D] per layer; row h is a permutation of 0..D-1 (stored channel j holds channel perm[h, j]).
"""
from __future__ import annotations

import torch

SWEEPS = 8          # passes over the group pairs; each applies improving swaps until none is left
SCORE_QUERIES = 256  # calibration queries (evenly spaced) the final check scores against every calibration key


def check_permutation(p, n_kv_heads: int, head_dim: int, name: str = "perm") -> torch.Tensor:
    """A layer's channel permutation as int64 [Hk, D]: ValueError unless every row is a permutation of 0..D-1."""
    t = torch.as_tensor(p)
    if tuple(t.shape) != (n_kv_heads, head_dim) or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor [Hk={n_kv_heads}, D={head_dim}] (a permutation of the "
                         f"channels per KV head), got {tuple(t.shape)} {t.dtype}")
    from .oracle import check_rows
    t = t.long()
    check_rows(t, name)
    return t


def _index(x: torch.Tensor, p: torch.Tensor, heads_dim: int) -> torch.Tensor:
    shape = [1] * x.dim()
    shape[heads_dim], shape[-1] = p.shape[0], p.shape[1]
    return p.to(x.device).reshape(shape).expand(x.shape)


def permute_channels(x: torch.Tensor, p: torch.Tensor, heads_dim: int = -2) -> torch.Tensor:
    """x with its KV-head axis at `heads_dim` (default [..., Hk, D]; -3 for [..., Hk, T, D]): channel j of head h
    becomes channel p[h, j] of x (the keys a permuted cache stores)."""
    return torch.gather(x, -1, _index(x, p, heads_dim))


def unpermute_channels(x: torch.Tensor, p: torch.Tensor, heads_dim: int = -2) -> torch.Tensor:
    """The inverse of `permute_channels`: stored keys back in the model's channel order."""
    return torch.gather(x, -1, _index(x, p.argsort(-1), heads_dim))


def permute_queries(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """q [..., Hq, D] in the stored keys' channel order (query head h meets KV head h // (Hq / Hk))."""
    return torch.gather(q, -1, _index(q, p.repeat_interleave(q.shape[-2] // p.shape[0], 0), -2))


def _group_cost(x: torch.Tensor, w: torch.Tensor, sym: bool) -> torch.Tensor:
    """x [T, n, g] one head's tokens in n groups of g channels; w [n, g] query energies -> cost [n]."""
    r = x.abs().amax(-1) if sym else x.amax(-1) - x.amin(-1)  # [T, n]
    return r.pow(2).mean(0) * w.sum(-1)


def _swap_gain(xa, xb, wa, wb, sym: bool):
    """Cost of groups a and b (xa, xb [T, g]; wa, wb [g]) after swapping channel i of a with channel j of b,
    for every (i, j): [g, g]."""
    def ext(x, big):  # per token: the group's extreme without channel i, [T, g]
        v = x.abs() if sym else (x if big else -x)
        top2 = v.topk(2, -1)
        first = top2.values[:, :1].expand_as(v)
        rest = torch.where(torch.arange(v.shape[1], device=v.device)[None] == top2.indices[:, :1],
                           top2.values[:, 1:2], first)
        return rest
    def cost(x_rest_hi, x_rest_lo, incoming, w_rest):  # [T, g] extremes without i, incoming [T, g'] -> [g, g']
        if sym:
            hi = torch.maximum(x_rest_hi[:, :, None], incoming.abs()[:, None, :])
            r = hi
        else:
            hi = torch.maximum(x_rest_hi[:, :, None], incoming[:, None, :])
            lo = torch.minimum(-x_rest_lo[:, :, None], incoming[:, None, :])
            r = hi - lo
        return r.pow(2).mean(0) * w_rest
    ahi, alo, bhi, blo = ext(xa, True), ext(xa, False), ext(xb, True), ext(xb, False)
    ca = cost(ahi, alo, xb, wa.sum() - wa[:, None] + wb[None, :])          # [g_a, g_b]
    cb = cost(bhi, blo, xa, wb.sum() - wb[:, None] + wa[None, :]).T        # [g_a, g_b]
    return ca + cb


def _fit_head(x: torch.Tensor, w: torch.Tensor, g: int, sym: bool) -> torch.Tensor:
    """Steepest-descent channel swaps between groups for one head: x [T, D], w [D] -> perm int64 [D]."""
    D = x.shape[1]
    n = D // g
    perm = torch.arange(D, device=x.device)
    for _ in range(SWEEPS):
        moved = False
        for a in range(n):
            for b in range(a + 1, n):
                for _step in range(g):
                    ia, ib = perm[a * g:(a + 1) * g], perm[b * g:(b + 1) * g]
                    xa, xb, wa, wb = x[:, ia], x[:, ib], w[ia], w[ib]
                    now = _group_cost(torch.stack([xa, xb], 1), torch.stack([wa, wb]), sym).sum()
                    after = _swap_gain(xa, xb, wa, wb, sym)
                    best = int(after.argmin())
                    if not float(after.view(-1)[best]) < float(now) * (1 - 1e-6):
                        break
                    i, j = divmod(best, g)
                    perm[a * g + i], perm[b * g + j] = int(ib[j]), int(ia[i])
                    moved = True
        if not moved:
            break
    return perm


def fit_permutation(k: torch.Tensor, q: torch.Tensor, spec, sink: int = 0) -> torch.Tensor:
    """Channel permutations int64 [Hk, D] from calibration keys k [B, Hk, T, D] (post-RoPE, as the cache stores
    them, already smoothed for a smoothed spec) and queries q [B, Hq, T, D] (Hq a multiple of Hk; smoothed alike):
    the grouping with the least proxy score error (module docstring), kept per head only when the spec's quantized
    keys give a lower centred score error on the calibration queries than without it. The first `sink` tokens are
    left out. ValueError for bad shapes, too few tokens, or a spec whose groups do not run along the channels."""
    import dataclasses

    from ..spec import as_spec
    from .oracle import fake_quantize
    from .smoothing import check_calibration
    spec = as_spec(spec)
    B, Hk, T, D = check_calibration(k, q, sink, "a permutation")
    if spec.axis != "tok" or spec.is_float_storage:
        raise ValueError(f"spec {spec} does not group channels within a token; a permutation changes nothing")
    plain = dataclasses.replace(spec, permute=False, smooth=False, smooth_pairs=False, calibrated=False)
    g = plain.group_size(D)
    kf = torch.nan_to_num(k[:, :, sink:].float(), nan=0.0, posinf=0.0, neginf=0.0)
    qf = torch.nan_to_num(q[:, :, sink:].float(), nan=0.0, posinf=0.0, neginf=0.0)
    w = qf.reshape(B, Hk, -1, T - sink, D).pow(2).mean((0, 2, 3))                  # [Hk, D]
    x = kf.transpose(0, 1).reshape(Hk, -1, D)                                        # [Hk, B * T', D]
    ident = torch.arange(D, device=k.device)
    if g >= D:
        return ident.expand(Hk, D).clone()
    sym = plain.sym or plain.fmt != "int"
    fitted = torch.stack([_fit_head(x[h], w[h], g, sym) for h in range(Hk)])        # [Hk, D]
    idx = torch.linspace(0, T - sink - 1, min(SCORE_QUERIES, T - sink)).round().long().to(k.device)
    qs = qf[:, :, idx].reshape(B, Hk, -1, D)                                         # [B, Hk, G * n, D]

    def score_err(p):                                                                # [Hk]
        kp = permute_channels(kf, p, heads_dim=-3)
        e = permute_channels(qs, p, heads_dim=-3) @ (fake_quantize(kp.contiguous(), plain).float() - kp).transpose(-1, -2)
        return (e - e.mean(-1, keepdim=True)).pow(2).sum((0, 2, 3))
    better = score_err(fitted) < score_err(ident.expand(Hk, D))
    return torch.where(better[:, None], fitted, ident.expand(Hk, D)).contiguous()
