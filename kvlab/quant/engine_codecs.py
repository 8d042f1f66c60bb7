"""Engine codecs: the values an engine's own quantizer gives, where no kvlab spec reproduces its arithmetic
(kvlab.spec.engines names them in `k_codec`, `v_codec`, `q_round`). Each maps x [..., D] (float) to the
dequantized float32 values the engine reads back; per (token, head) rows, so a token's values never depend
on other tokens. The engine source each one follows is cited in the profile modules.

    vllm_int4_zp      vLLM int4_per_token_head: asymmetric 4-bit per row, integer zero point kept in the
                      low 4 mantissa bits of the fp32 scale
    turboquant{3,4}[_nc]  vLLM turboquant keys: unit vector times an fp16 norm, orthonormal Hadamard of the
                      whole head, Lloyd-Max codes for N(0, 1/D); _nc renormalizes the code vector
    nvfp4_ts1         NVFP4 with the per-layer fp32 scale at its default 1.0 (no checkpoint scale)
    nvfp4_4over6      NVFP4 (tensor scale 1.0) choosing per 16 values |x|max / 6 or / 4, whichever has the
                      smaller squared error
    sglang_mxfp4_16   SGLang fp4_mx_block16: e2m1 per 16 with scale 2^ceil(log2(|x|max / 6)), ties up
    ggml_iq4_nl       llama.cpp's iq4_nl KV write (quantize_row_iq4_nl_ref): codes nearest to x at scale
                      max / -127 (ties to the larger code), then the stored scale is the weighted least-squares
                      fit (weights x^2), rounded to fp16, the codes kept
    torch_fp8_e4m3, torch_fp8_e5m2  PyTorch's eager CUDA cast (SGLang's store and query cast): round to
                      nearest even, not saturating: e4m3 past 464 is NaN (measured on the H200 with torch 2.11,
                      sweeps/results/h200/flashinfer_fp8/header.json, whose CPU cast agreed; PyTorch 2.13.0+cpu clamps to 448),
                      e5m2 past 61440 is +-inf (IEEE overflow; not measured)
Any other name is read as a kvlab spec text (`fake_quantize`).
"""
from __future__ import annotations

import functools
import math

import torch

from .formats import E2M1, IQ4NL, fp8_value
from .oracle import fake_quantize
from .rotation import hadamard_blocks

FP4_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)  # e2m1 magnitude i+1 from |v| >= bound i (SGLang: ties up)
E2M1_POS = torch.tensor(E2M1[:8])


def apply(name: str, x: torch.Tensor) -> torch.Tensor:
    """x [..., D] as engine codec (or kvlab spec) `name` stores and reads it back; float32."""
    fn = CODECS.get(name)
    if fn is not None:
        return fn(x.float())
    return fake_quantize(x.float().contiguous(), name).float()


def vllm_int4_zp(x: torch.Tensor) -> torch.Tensor:
    mx, mn = x.amax(-1, keepdim=True), x.amin(-1, keepdim=True)
    scale = torch.clamp((mx - mn) / 15.0, min=1e-6)
    zp = _round_away(-mn / scale).clamp(0, 15)
    q = _round_away(x * (1.0 / scale) + zp).clamp(0, 15)
    stored = (scale.view(torch.int32) & -16).view(torch.float32)  # the zero point overwrote 4 mantissa bits
    return (q - zp) * stored


def _round_away(v: torch.Tensor) -> torch.Tensor:
    return torch.where(v >= 0, torch.floor(v + 0.5), torch.ceil(v - 0.5))


@functools.lru_cache(maxsize=16)
def lloyd_max_normal(d: int, bits: int, iters: int = 200) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(centroids, boundaries) of the Lloyd-Max quantizer with 2^bits levels for N(0, 1/d): start evenly over
    +-3.5 sigma, then alternate midpoint boundaries and conditional means (closed form with the normal CDF)."""
    from scipy.stats import norm
    n, sigma = 2 ** bits, 1.0 / math.sqrt(d)
    c = [(-3.5 + 7.0 * (i + 0.5) / n) * sigma for i in range(n)]
    for _ in range(iters):
        b = [(c[i] + c[i + 1]) / 2 for i in range(n - 1)]
        edges = [-math.inf, *b, math.inf]
        new = []
        for i in range(n):
            za, zb = edges[i] / sigma, edges[i + 1] / sigma
            mass = norm.cdf(zb) - norm.cdf(za)
            new.append(sigma * (norm.pdf(za) - norm.pdf(zb)) / mass if mass > 1e-15 else c[i])
        done = max(abs(u - v) for u, v in zip(new, c)) < 1e-12
        c = new
        if done:
            break
    return tuple(c), tuple((c[i] + c[i + 1]) / 2 for i in range(n - 1))


def turboquant(x: torch.Tensor, bits: int, nc: bool) -> torch.Tensor:
    D = x.shape[-1]
    if D & (D - 1):
        raise ValueError(f"turboquant keys need a power-of-two head_dim (one Hadamard over the head), got {D}")
    cents, bounds = (torch.tensor(t, dtype=torch.float32, device=x.device) for t in lloyd_max_normal(D, bits))
    H = hadamard_blocks(D, D, x.device)
    norm = x.norm(dim=-1, keepdim=True)
    y = (x / (norm + 1e-8)) @ H
    c = cents[torch.bucketize(y, bounds, right=True)]  # y >= boundary -> the upper code
    if nc:
        c = c / torch.sqrt((c * c).sum(-1, keepdim=True) + 1e-16)
    return (norm.half().float() * c) @ H.T


def nvfp4(x: torch.Tensor, ratios: tuple[float, ...] = (6.0,)) -> torch.Tensor:
    """NVFP4 values with tensor scale 1.0: e4m3 scale of |x|max / r per 16 values (the r of least squared
    error), codes the nearest e2m1 value (ties to the smaller magnitude, as kvlab's fp4)."""
    if len(ratios) == 1:
        return fake_quantize(x.contiguous(), "fp4_e2m1:g16:s=e4m3:ts", tensor_scale=1.0).float()
    g = x.reshape(*x.shape[:-1], -1, 16)
    amax = g.abs().amax(-1, keepdim=True)
    best, err = None, None
    for r in ratios:
        s = fp8_value((amax / r).clamp(max=448.0).to(torch.float8_e4m3fn).view(torch.uint8), "fp8_e4m3")
        v = torch.where(s > 0, g / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(g))
        y = _e2m1_nearest(v) * s
        e = ((y - g) ** 2).sum(-1, keepdim=True)
        best = y if best is None else torch.where(e < err, y, best)
        err = e if err is None else torch.minimum(e, err)
    return best.reshape(x.shape)


def _e2m1_nearest(v: torch.Tensor) -> torch.Tensor:
    grid = E2M1_POS.to(v.device)
    a = v.abs().clamp(max=6.0)
    idx = (a.unsqueeze(-1) - grid).abs().argmin(-1)  # first (smaller magnitude) on ties
    return torch.copysign(grid[idx], v)


def sglang_mxfp4_16(x: torch.Tensor) -> torch.Tensor:
    g = x.reshape(*x.shape[:-1], -1, 16)
    amax = g.abs().amax(-1, keepdim=True)
    s = torch.exp2(torch.ceil(torch.log2(torch.clamp(amax / 6.0, min=1e-10))))
    a = (g / s).abs()
    idx = sum((a >= b).to(torch.int64) for b in FP4_BOUNDS)
    y = torch.copysign(E2M1_POS.to(x.device)[idx], g) * s
    return y.reshape(x.shape)


def ggml_iq4_nl(x: torch.Tensor) -> torch.Tensor:
    """llama.cpp's iq4_nl values (ggml-quants.c `quantize_row_iq4_nl_impl` with no importance weights and
    ntry = -1, as its CPU KV write calls it) per 32 values along the last dim."""
    vals = torch.tensor(IQ4NL, dtype=torch.float32, device=x.device)
    g = x.reshape(*x.shape[:-1], -1, 32)
    mx = g.gather(-1, g.abs().argmax(-1, keepdim=True))  # the signed extreme, first one on ties
    d0 = mx / -127.0
    al = g * torch.where(d0 != 0, 1.0 / d0, torch.zeros_like(d0))
    mu = torch.searchsorted(vals, al.contiguous(), right=True).clamp(1, 15)  # val[mu-1] <= al < val[mu]
    lo, hi = vals[mu - 1], vals[mu]
    idx = torch.where(al - lo < hi - al, mu - 1, mu)  # best_index_int8: a tie takes the upper code
    idx = torch.where(al <= vals[0], torch.zeros_like(idx), torch.where(al >= vals[15], torch.full_like(idx, 15), idx))
    q = vals[idx]
    w = g * g
    sq2 = (w * q * q).sum(-1, keepdim=True)
    d = torch.where(sq2 > 0, (w * q * g).sum(-1, keepdim=True) / torch.where(sq2 > 0, sq2, torch.ones_like(sq2)),
                    torch.zeros_like(sq2))
    d = torch.where(mx.abs() < 1e-15, torch.zeros_like(d), d)
    return (d.half().float() * q).reshape(x.shape)


def torch_cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """PyTorch's CUDA fp8 cast on any device: round to nearest even inside the range, NaN (e4m3) / inf (e5m2)
    past its rounding boundary, whatever the local device's cast does there."""
    top, edge = (448.0, 464.0) if dtype == torch.float8_e4m3fn else (57344.0, 61440.0)
    y = x.clamp(-top, top).to(dtype).float()
    over = torch.full_like(x, float("nan")) if dtype == torch.float8_e4m3fn else torch.copysign(
        torch.full_like(x, float("inf")), x)
    return torch.where(x.abs() > edge, over, torch.where(torch.isnan(x), x, y))


CODECS = {
    "vllm_int4_zp": vllm_int4_zp,
    "turboquant3": functools.partial(turboquant, bits=3, nc=False),
    "turboquant4": functools.partial(turboquant, bits=4, nc=False),
    "turboquant3_nc": functools.partial(turboquant, bits=3, nc=True),
    "turboquant4_nc": functools.partial(turboquant, bits=4, nc=True),
    "nvfp4_ts1": nvfp4,
    "nvfp4_4over6": functools.partial(nvfp4, ratios=(6.0, 4.0)),
    "sglang_mxfp4_16": sglang_mxfp4_16,
    "ggml_iq4_nl": ggml_iq4_nl,
    "torch_fp8_e4m3": functools.partial(torch_cast, dtype=torch.float8_e4m3fn),
    "torch_fp8_e5m2": functools.partial(torch_cast, dtype=torch.float8_e5m2),
}
