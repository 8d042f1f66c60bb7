"""Synthetic K/V distributions for round-trip error (torch, seeded, CPU or GPU).

Each generator returns float32 [n_tokens, head_dim] (use `sample(name, ...)`). Heavy tails and
outliers are what break per-token int4 scales: real keys have a few outlier channels (max/median
channel absmax ~4-5x, kurtosis ~8.6 on SmolLM2), attention-sink tokens are 10-50x larger.
"""
from __future__ import annotations

import torch

DISTRIBUTIONS = ("gaussian", "student_t3", "student_t4", "student_t5", "laplace", "outlier_channels",
                 "sink_tokens", "freetoken")


def _gen(seed: int, device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def student_t(nu: float, n: int, d: int, seed: int = 0, device="cpu") -> torch.Tensor:
    """Student-t(nu) samples [n, d] via normal / sqrt(chi2 / nu) (generator-seeded, reproducible)."""
    g = _gen(seed, device)
    z = torch.randn(n, d, generator=g, device=device)
    chi2 = torch.randn(n, d, int(nu), generator=g, device=device).pow(2).sum(-1)
    return z / torch.sqrt(chi2 / nu)


def laplace(n: int, d: int, seed: int = 0, device="cpu") -> torch.Tensor:
    g = _gen(seed, device)
    u = torch.rand(n, d, generator=g, device=device) - 0.5
    return -torch.sign(u) * torch.log1p(-2 * u.abs().clamp(max=0.4999999))


def outlier_channels(n: int, d: int, seed: int = 0, device="cpu", n_outliers: int = 4,
                     lo: float = 5.0, hi: float = 20.0) -> torch.Tensor:
    """Gaussian with `n_outliers` channels scaled by factors in [lo, hi] (KIVI's key outliers)."""
    return _scaled_gaussian(n, d, seed, device, lo, hi, channels=n_outliers)


def sink_tokens(n: int, d: int, seed: int = 0, device="cpu", n_sinks: int = 1,
                lo: float = 10.0, hi: float = 50.0) -> torch.Tensor:
    """Gaussian with the first `n_sinks` tokens scaled 10-50x (attention sinks)."""
    return _scaled_gaussian(n, d, seed, device, lo, hi, tokens=n_sinks)


def _scaled_gaussian(n: int, d: int, seed: int, device, lo: float, hi: float, channels: int = 0, tokens: int = 0):
    """Gaussian [n, d] with `channels` random channels or the first `tokens` rows scaled by factors in [lo, hi]."""
    g = _gen(seed, device)
    x = torch.randn(n, d, generator=g, device=device)
    if channels:
        ch = torch.randperm(d, generator=g, device=device)[:channels]
        x[:, ch] *= lo + (hi - lo) * torch.rand(channels, generator=g, device=device)
    if tokens:
        x[:tokens] *= lo + (hi - lo) * torch.rand(tokens, 1, generator=g, device=device)
    return x


def freetoken(n: int, d: int, seed: int = 0, device="cpu") -> torch.Tensor:
    """FreeToken's test distribution: normal x 3, first head_dim/16 channels x 5, rounded to bf16."""
    g = _gen(seed, device)
    x = torch.randn(n, d, generator=g, device=device) * 3
    x[:, : max(1, d // 16)] *= 5
    return x.to(torch.bfloat16).float()


def sample(name: str, n: int = 4096, d: int = 128, seed: int = 0, device="cpu") -> torch.Tensor:
    """float32 [n, d] samples of distribution `name` (see DISTRIBUTIONS)."""
    if name == "gaussian":
        return torch.randn(n, d, generator=_gen(seed, device), device=device)
    if name.startswith("student_t") and name[9:].isdigit():
        return student_t(int(name[9:]), n, d, seed, device)
    fns = {"laplace": laplace, "outlier_channels": outlier_channels, "sink_tokens": sink_tokens, "freetoken": freetoken}
    if name not in fns:
        raise ValueError(f"unknown distribution {name!r}; allowed: {', '.join(DISTRIBUTIONS)}")
    return fns[name](n, d, seed, device)
