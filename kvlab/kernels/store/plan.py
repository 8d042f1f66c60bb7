"""Which spec the store kernel is launched with (pure Python, no Triton import).

A rotated spec (`rot=had`) is stored by the kernel as it is where the kernel runs the rotation itself
(`fuses_rotation`); otherwise the tokens are rotated by `kvlab.quant.rotation.rotate` before the launch and the
kernel sees the spec without its rotation. Tuned store configs are keyed by that kernel spec (`kernel_spec`), so the
store call, `tune()`, the sweep's speed stage and the benchmarks name the same entry.
"""
from __future__ import annotations

import dataclasses

from ...quant.rotation import hadamard_block


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def fuses_rotation(spec, D: int) -> bool:
    """True when the kernel applies a rotated spec's Hadamard rotation itself: token rows (not axis chan) of a
    power-of-two head_dim 16..256 that is one Hadamard block, and power-of-two groups (unpadded tiles)."""
    if spec.rotation != "had" or spec.axis == "chan" or spec.is_float_storage:
        return False
    G = spec.group_size(D)
    return 16 <= D <= 256 and _pow2(D) and hadamard_block(D) == D and _pow2(G) and D % G == 0


def kernel_spec(spec, D: int):
    """The spec the store kernel is launched with for head_dim D (see the module docstring)."""
    if spec.rotation == "none" or fuses_rotation(spec, D):
        return spec
    return dataclasses.replace(spec, rotation="none")
