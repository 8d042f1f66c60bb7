"""Kernel tests: run Triton kernels in the interpreter when no GPU is present (set before triton loads),
and poison fresh outputs so a kernel that skips a write (or writes out of place) shows up."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

POISON_BYTE = 0xA5  # integer/uint8 outputs: a byte no correct write leaves behind by accident everywhere


def poison_(t):
    """Fill a tensor in place with NaN (float dtypes) or POISON_BYTE bytes (ints, fp8); returns it."""
    if t is None:
        return t
    if t.dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        t.fill_(float("nan"))
    else:
        t.view(torch.uint8).fill_(POISON_BYTE)
    return t


@pytest.fixture
def poison():
    """poison(x): NaN-fill a tensor, or every tensor of a dict (page tensors), in place; returns x."""
    def _poison(x):
        if isinstance(x, dict):
            for t in x.values():
                poison_(t)
            return x
        return poison_(x)
    return _poison
