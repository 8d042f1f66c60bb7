"""Error metrics between a reference tensor and its approximation (float64 reductions)."""
from __future__ import annotations

import math

import torch


def _pair(x: torch.Tensor, y: torch.Tensor):
    if x.shape != y.shape:
        raise ValueError(f"shapes differ: reference {tuple(x.shape)} vs approximation {tuple(y.shape)}")
    return x.double(), y.double()


def rel_l1(x: torch.Tensor, y: torch.Tensor) -> float:
    """mean|y - x| / mean|x|."""
    x, y = _pair(x, y)
    return ((y - x).abs().mean() / x.abs().mean()).item()


def rel_l2(x: torch.Tensor, y: torch.Tensor) -> float:
    """||y - x||_2 / ||x||_2."""
    x, y = _pair(x, y)
    return (torch.linalg.vector_norm(y - x) / torch.linalg.vector_norm(x)).item()


def sqnr_db(x: torch.Tensor, y: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio in dB: 10 log10(sum x^2 / sum (y - x)^2); inf if exact."""
    x, y = _pair(x, y)
    noise = ((y - x) ** 2).sum().item()
    return math.inf if noise == 0 else 10 * math.log10((x ** 2).sum().item() / noise)


def max_abs(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = _pair(x, y)
    return (y - x).abs().max().item()


def all_metrics(x: torch.Tensor, y: torch.Tensor) -> dict:
    """{rel_l1, rel_l2, sqnr_db, max_abs} of approximation y against reference x."""
    return {"rel_l1": rel_l1(x, y), "rel_l2": rel_l2(x, y), "sqnr_db": sqnr_db(x, y), "max_abs": max_abs(x, y)}
