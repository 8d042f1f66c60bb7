"""Calibrated key smoothing (`smooth` on a K spec): divide key channels by s, multiply queries by s.

Scores are unchanged, q k^T = (q * s)(k / s)^T, but the stored keys' channels are balanced against the queries
they meet (SmoothQuant's migration applied to attention, as KVQuant's per-channel pre-scaling): a channel where
keys are large and queries small costs bits it does not repay in the scores. The factor of channel c balances the
two sides, s_c^2 = rms(k_c) / rms(q_c) (keys over the calibration tokens past the sinks; queries over the same
tokens and the KV head's query heads), which minimises (sum_c q_c^2 s_c^2)(sum_c k_c^2 / s_c^2).

The factors of `smooth` are per channel of the stored (post-RoPE) keys, which is why it does not combine with
`prerope`: RoPE mixes channel c with c + D/2, so a per-channel factor does not commute with it, and the balance it
finds depends on the positions of the calibration text: the low-frequency pairs have hardly rotated within 512
calibration tokens, and at 8K their energy sits on the other channel of the pair. The smoothed 2.5-bit SmolLM2
winner found the 8K passkey 0 of 3 times with per-channel factors and 3 of 3 with factors tied within RoPE pairs
(sweeps/results/quality/passkey_smoothing.txt). `smooth=pair` fits one factor per pair from the pair's energy,
which rotation leaves unchanged (at 2K the two cost the same within one sd: +11.57% per channel, +12.30% tied,
+12.82% unsmoothed, key_probes_smoothing.txt). Rounding factors to powers of two would make k / s exact but gave
the gain back (+13.07%).
So the full-precision window holds k / s rounded to the pool's fp dtype and queries are multiplied by s in their
dtype: one more rounding of the size the fp dtype already makes.

Shapes: s float32 [Hk, D] per layer (one vector per KV head).
"""
from __future__ import annotations

import torch

MAX_LOG2 = 8  # |log2 s| bound: a nearly dead channel must not scale keys by 2^-40


ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)  # migration strengths searched when a spec is given (0: no smoothing)
SCORE_QUERIES = 256  # calibration queries (evenly spaced) the alpha search scores against every calibration key


def fit_smoothing(k: torch.Tensor, q: torch.Tensor, sink: int = 0, spec=None, alpha: float | None = None,
                  alphas=ALPHAS, pairs: bool = False) -> torch.Tensor:
    """Smoothing factors float32 [Hk, D] (geometric mean 1 per head, within [2^-8, 2^8]) from calibration keys
    k [B, Hk, T, D] (post-RoPE, as the cache stores them) and queries q [B, Hq, T, D] (Hq a multiple of Hk):
    s_c = (rms(k_c) / rms(q_c))^alpha. The first `sink` tokens are left out (attention sinks have outlier keys that
    decode reads in full precision). Channels where either side is all zero keep factor 1.

    alpha: the migration strength (0.5 balances the two sides, SmoothQuant's default). None with a `spec` (the K
    spec the smoothed keys are quantized with; `smooth` and `cal` ignored): per layer, the strength in `alphas`
    whose quantized keys give the least error in the attention scores of calibration queries (centred per query:
    softmax ignores a shift), as AWQ searches its scaling exponent; 0 is among them, so a layer smoothing does not
    help keeps s = 1. None without a spec: 0.5.

    pairs: one factor per RoPE pair (c, c + D/2; rotate-half, as both decoders): the rms over the pair's two
    channels, an energy RoPE's rotation leaves unchanged, so the factor does not depend on the positions the
    calibration text covered (the `smooth=pair` spec option). ValueError for bad shapes or too few tokens."""
    B, Hk, T, D = check_calibration(k, q, sink, "smoothing")
    kf, qf = k[:, :, sink:].float(), q[:, :, sink:].float()
    kf = torch.where(torch.isfinite(kf), kf, torch.zeros_like(kf))
    qf = torch.where(torch.isfinite(qf), qf, torch.zeros_like(qf))
    if pairs and D % 2:
        raise ValueError(f"pairs ties channels c and c + D/2 (RoPE pairs); head_dim {D} is odd")
    a = kf.pow(2).mean((0, 2))                                                  # [Hk, D] mean squares
    b = qf.reshape(B, Hk, -1, T - sink, D).pow(2).mean((0, 2, 3))               # [Hk, D]
    if pairs:  # the pair's energy: the same for both channels of a pair
        a, b = (torch.cat([(t[:, :D // 2] + t[:, D // 2:]) / 2] * 2, -1) for t in (a, b))
    a, b = a.sqrt(), b.sqrt()
    ok = (a > 0) & (b > 0)
    w = ok.float()
    lr = torch.where(ok, a.clamp_min(1e-30).log2() - b.clamp_min(1e-30).log2(), torch.zeros_like(a))
    lr = lr - ((lr * w).sum(-1, keepdim=True) / w.sum(-1, keepdim=True).clamp_min(1)) * w  # centred log ratio

    def factors(al: float) -> torch.Tensor:
        return torch.exp2((al * lr).clamp(-MAX_LOG2, MAX_LOG2)).float()
    if alpha is not None or spec is None:
        al = 0.5 if alpha is None else float(alpha)
        if not 0.0 <= al <= 1.0:
            raise ValueError(f"alpha={alpha!r} must be within [0, 1]")
        return factors(al)
    best = _best_alpha(kf, qf, spec, factors, alphas)                           # [Hk]
    return torch.stack([factors(al)[h] for h, al in enumerate(best)])


def _best_alpha(kf, qf, spec, factors, alphas) -> list[float]:
    """Per KV head, the strength in `alphas` with the least centred score error of the quantized, smoothed keys
    kf [B, Hk, T, D] against calibration queries qf [B, Hq, T, D] (the first minimum on ties)."""
    import dataclasses

    from ..spec import as_spec
    from .oracle import fake_quantize
    spec = as_spec(spec)
    if spec.is_float_storage:
        raise ValueError(f"spec {spec} stores keys as they are: there is nothing to smooth them for")
    spec = dataclasses.replace(spec, smooth=False, smooth_pairs=False, calibrated=False, pre_rope=False)
    B, Hk, T, D = kf.shape
    if spec.axis == "chan":
        T = T // spec.group * spec.group
        kf, qf = kf[:, :, :T], qf[:, :, :T]
    if T == 0:
        return [0.5] * Hk
    idx = torch.linspace(0, T - 1, min(SCORE_QUERIES, T)).round().long().to(kf.device)
    qs = qf[:, :, idx].reshape(B, Hk, -1, D)                                   # [B, Hk, G * n, D]
    errs = []
    for al in alphas:
        s = factors(al)[None, :, None, :]                                       # [1, Hk, 1, D]
        kh = fake_quantize((kf / s).contiguous(), spec).float() * s
        e = qs @ (kh - kf).transpose(-1, -2)                                   # [B, Hk, G * n, T]
        errs.append((e - e.mean(-1, keepdim=True)).pow(2).sum((0, 2, 3)))       # [Hk]
    pick = torch.stack(errs).argmin(0)                                          # the first minimum per head
    return [float(alphas[int(i)]) for i in pick]


def check_calibration(k, q, sink: int, what: str) -> tuple[int, int, int, int]:
    """(B, Hk, T, D) of calibration keys k [B, Hk, T, D] and queries q [B, Hq, T, D] (Hq a multiple of Hk): ValueError
    for other shapes or no token past the `sink` first ones (what: the fit, for the message)."""
    if not isinstance(k, torch.Tensor) or k.dim() != 4 or not k.is_floating_point():
        raise ValueError(f"k must be a float tensor [B, Hk, T, D], got {getattr(k, 'shape', type(k).__name__)}")
    B, Hk, T, D = k.shape
    if (not isinstance(q, torch.Tensor) or q.dim() != 4 or q.shape[0] != B or q.shape[2] != T or q.shape[3] != D
            or q.shape[1] % Hk):
        raise ValueError(f"q must be [B={B}, Hq (a multiple of {Hk}), T={T}, D={D}], got {getattr(q, 'shape', q)}")
    if not 0 <= sink < T:
        raise ValueError(f"{what} needs calibration tokens past the {sink} sinks, got {T}")
    return B, Hk, T, D


def check_smoothing(s, n_kv_heads: int, head_dim: int, name: str = "smooth") -> torch.Tensor:
    """A layer's smoothing factors as float32 [Hk, D]: ValueError unless finite and within [2^-8, 2^8]."""
    t = torch.as_tensor(s)
    if tuple(t.shape) != (n_kv_heads, head_dim) or not t.is_floating_point():
        raise ValueError(f"{name} must be a float tensor [Hk={n_kv_heads}, D={head_dim}], got {tuple(t.shape)} "
                         f"{t.dtype}")
    t = t.float()
    lo, hi = 2.0 ** -MAX_LOG2, 2.0 ** MAX_LOG2
    if not bool(torch.isfinite(t).all()) or not bool(((t >= lo) & (t <= hi)).all()):
        raise ValueError(f"{name} factors must be finite and within [2^-{MAX_LOG2}, 2^{MAX_LOG2}], got min "
                         f"{t.min().item()}, max {t.max().item()}")
    return t


def unsmoothed(spec):
    """The spec without `smooth` and `perm`: how the stored (already divided and permuted) keys are quantized and
    read."""
    import dataclasses
    return dataclasses.replace(spec, smooth=False, smooth_pairs=False, permute=False) \
        if (spec.smooth or spec.permute) else spec


def smooth_queries(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """q [..., Hq, D] times s [Hk, D] (query head h meets KV head h // (Hq / Hk)), in q's dtype."""
    Hq, Hk = q.shape[-2], s.shape[0]
    return q * s.repeat_interleave(Hq // Hk, 0).to(q.dtype)


def smooth_keys(k: torch.Tensor, s: torch.Tensor, heads_dim: int = -2) -> torch.Tensor:
    """k with its KV-head axis at `heads_dim` (default [..., Hk, D]; -3 for [..., Hk, T, D]) divided by s [Hk, D]
    in k's dtype: the keys a smoothed cache stores."""
    shape = [1] * k.dim()
    shape[heads_dim], shape[-1] = s.shape[0], s.shape[1]
    return k / s.reshape(shape).to(k.dtype)


def unsmooth_keys(k: torch.Tensor, s: torch.Tensor, heads_dim: int = -2) -> torch.Tensor:
    """The inverse of `smooth_keys`: stored keys back to the model's."""
    shape = [1] * k.dim()
    shape[heads_dim], shape[-1] = s.shape[0], s.shape[1]
    return k * s.reshape(shape).to(k.dtype)
