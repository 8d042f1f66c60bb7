"""Hadamard rotation over head_dim (QuaRot / SpinQuant style, no calibration).

A normalised Sylvester Hadamard matrix H (H @ H.T = I) spreads outlier channels across the
whole head, so one scale fits a rotated row better. For head_dims that are not a power of
two (80, 96) the rotation is block-diagonal with the largest power-of-two block dividing D.
Attention is invariant when q and k are rotated alike; V's output is rotated back with H.T.
"""
from __future__ import annotations

import functools

import torch


def hadamard_block(head_dim: int) -> int:
    """Size of the Hadamard block used for `head_dim` (largest power of two dividing it, <= 256)."""
    b = head_dim & -head_dim
    return min(b, 256)


@functools.lru_cache(maxsize=16)
def _hadamard_cpu(n: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / n ** 0.5).float()


def hadamard(head_dim: int, device=None) -> torch.Tensor:
    """[D, D] float32 orthonormal block-Hadamard matrix for `head_dim`, cached per device (treat it as read-only:
    a cached matrix needs no host-to-device copy, so rotations can run inside CUDA-graph capture)."""
    if head_dim % 8:
        raise ValueError(f"Hadamard rotation needs head_dim divisible by 8, got {head_dim}")
    return _hadamard_on(head_dim, str(torch.device(device)) if device is not None else "cpu")


@functools.lru_cache(maxsize=32)
def _hadamard_on(head_dim: int, device: str, block: int = 0) -> torch.Tensor:
    b = block or hadamard_block(head_dim)
    return torch.block_diag(*[_hadamard_cpu(b)] * (head_dim // b)).to(device)


def hadamard_blocks(head_dim: int, block: int, device=None) -> torch.Tensor:
    """[D, D] float32 block-diagonal matrix of normalized Sylvester Hadamard blocks of size `block` (a power of
    two dividing head_dim), cached per device and read-only, as an engine that rotates in fixed blocks uses."""
    if block < 1 or block & (block - 1) or head_dim % block:
        raise ValueError(f"Hadamard block {block} must be a power of two dividing head_dim {head_dim}")
    return _hadamard_on(head_dim, str(torch.device(device)) if device is not None else "cpu", block)


def rotate(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] -> x @ H (float32)."""
    return x.float() @ hadamard(x.shape[-1], x.device)


def unrotate(y: torch.Tensor) -> torch.Tensor:
    """Inverse of `rotate`: y [..., D] -> y @ H.T (float32)."""
    return y.float() @ hadamard(y.shape[-1], y.device).T
