"""Hadamard rotation over head_dim (QuaRot / SpinQuant style, no calibration).

A normalised Sylvester Hadamard matrix H (H @ H.T = I) spreads outlier channels across the
whole head, so one scale fits a rotated row better. For head_dims that are not a power of
two (80, 96) the rotation is block-diagonal with the largest power-of-two block dividing D.
Attention is invariant when q and k are rotated alike; V's output is rotated back with H.T.

What a rotated spec stores is defined by `rotate`: a fast Walsh-Hadamard transform in float32, in a
fixed order of operations (constant geometry: every stage maps x to [x_even + x_odd, x_even - x_odd],
log2(block) stages, then one multiply by the float32 constant 1/sqrt(block)). Each operation is one IEEE
add, subtract or multiply, so any implementation that follows the same order (the Triton store fuses it,
`kvlab.kernels.tiles.rotate`) gets the same bits on any machine; a matmul by H would not (its summation
order is the BLAS library's). Mathematically it is x @ H; the two differ by float32 rounding only.
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


def hadamard_signs(head_dim: int, device=None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`hadamard(head_dim)` without its 1/sqrt(block) (`norm_constant(hadamard_block(head_dim))`): entries +-1 and
    0, exact in any float dtype, so a 16-bit matmul by it rounds only its sums (cached per device; read-only)."""
    if head_dim % 8:
        raise ValueError(f"Hadamard rotation needs head_dim divisible by 8, got {head_dim}")
    return _signs_on(head_dim, str(torch.device(device)) if device is not None else "cpu", dtype)


@functools.lru_cache(maxsize=32)
def _signs_on(head_dim: int, device: str, dtype: torch.dtype) -> torch.Tensor:
    return torch.block_diag(*[_hadamard_cpu(hadamard_block(head_dim)).sign()] * (head_dim // hadamard_block(head_dim))
                            ).to(device=device, dtype=dtype)


def hadamard_blocks(head_dim: int, block: int, device=None) -> torch.Tensor:
    """[D, D] float32 block-diagonal matrix of normalized Sylvester Hadamard blocks of size `block` (a power of
    two dividing head_dim), cached per device and read-only, as an engine that rotates in fixed blocks uses."""
    if block < 1 or block & (block - 1) or head_dim % block:
        raise ValueError(f"Hadamard block {block} must be a power of two dividing head_dim {head_dim}")
    return _hadamard_on(head_dim, str(torch.device(device)) if device is not None else "cpu", block)


def norm_constant(block: int) -> float:
    """1/sqrt(block) rounded to float32 (returned as a Python float holding that float32 value): what `rotate`
    multiplies by."""
    return float(torch.tensor(1.0 / block ** 0.5, dtype=torch.float32))


def fwht(x: torch.Tensor, block: int) -> torch.Tensor:
    """Unnormalized Walsh-Hadamard transform of float32 x [..., D] in blocks of `block` (a power of two dividing
    D), Sylvester order, constant geometry: log2(block) stages of y = [x_even + x_odd, x_even - x_odd]."""
    if block < 1 or block & (block - 1) or x.shape[-1] % block:
        raise ValueError(f"Walsh-Hadamard block {block} must be a power of two dividing the last dim {x.shape[-1]}")
    n = x.numel() // block
    y = x.reshape(n, block)
    if x.requires_grad:  # the same operations through autograd (out= writes are not differentiable)
        for _ in range(block.bit_length() - 1):
            pairs = y.view(n, block // 2, 2)
            y = torch.cat([pairs[..., 0] + pairs[..., 1], pairs[..., 0] - pairs[..., 1]], -1)
        return y.reshape(x.shape)
    bufs = [torch.empty(n, 2, block // 2, dtype=x.dtype, device=x.device) for _ in range(min(2, block.bit_length() - 1))]
    for i in range(block.bit_length() - 1):  # ping-pong buffers: no concatenation copies (2x faster on the CPU)
        pairs, out = y.view(n, block // 2, 2), bufs[i % 2]
        torch.add(pairs[..., 0], pairs[..., 1], out=out[:, 0])  # [n, block/2] sums
        torch.sub(pairs[..., 0], pairs[..., 1], out=out[:, 1])  # differences
        y = out.view(n, block)
    return y.reshape(x.shape)


def rotate(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] -> x @ H in float32, by the fixed-order transform `fwht` times 1/sqrt(block) (see the module
    docstring: this order, not the matmul's, defines the rotated values a spec stores)."""
    D = x.shape[-1]
    if D % 8:
        raise ValueError(f"Hadamard rotation needs head_dim divisible by 8, got {D}")
    b = hadamard_block(D)
    # a Python float (the float32 value): no host-to-device copy, so rotations can run inside CUDA-graph capture;
    # float32 x times an exactly-float32 constant rounds once, as the kernel's multiply does
    return fwht(x.float(), b) * norm_constant(b)


def unrotate(y: torch.Tensor) -> torch.Tensor:
    """Inverse of `rotate` (H is symmetric and orthonormal, so the same transform): y [..., D] -> y @ H.T."""
    return rotate(y)
