"""Where kernels run: the Triton interpreter, the GPU, or an offline sm_90 compile. No Triton import.

One definition of each question the host code asks before a launch, so that every backend means
the same thing by "interpreting" or "GPU code paths".
"""
from __future__ import annotations

import contextlib
import os

import torch

_OFFLINE = False  # compile GPU code paths from CPU tensors (devtools' offline sm_90 compiler turns it on)


def interpreting() -> bool:
    """True when Triton runs kernels on the CPU interpreter (TRITON_INTERPRET set to anything but 0)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def gpu_codegen(t: torch.Tensor) -> bool:
    """True when a launch on `t` compiles real GPU code, where inline PTX (asm fast paths) may be used:
    a CUDA tensor outside the interpreter, or any tensor inside `offline_codegen()`."""
    return not interpreting() and (t.is_cuda or _OFFLINE)


def can_launch(t: torch.Tensor) -> bool:
    """True when a Triton kernel can be launched on `t`'s device: CUDA, or the CPU under the interpreter
    (or inside `offline_codegen()`, where launches only compile)."""
    return t.is_cuda or interpreting() or _OFFLINE


@contextlib.contextmanager
def offline_codegen():
    """Within: `gpu_codegen` is True for CPU tensors too (the offline compiler launches on CPU tensors)."""
    global _OFFLINE
    prev, _OFFLINE = _OFFLINE, True
    try:
        yield
    finally:
        _OFFLINE = prev


def on_gpu() -> bool:
    """A CUDA GPU is present and kernels run on it (not under the interpreter)."""
    return torch.cuda.is_available() and not interpreting()


def gpu_name(device=None) -> str:
    """The CUDA device's name, or "cpu" when kernels do not run on a GPU."""
    return torch.cuda.get_device_name(device) if on_gpu() else "cpu"


def num_sms(device=None) -> int:
    """Streaming multiprocessors of the GPU (4 off the GPU, so split counts stay small under the interpreter)."""
    if on_gpu():
        return torch.cuda.get_device_properties(device or 0).multi_processor_count
    return 4


def poisoned(shape, dtype, device) -> torch.Tensor:
    """A new output buffer: NaN-filled under the interpreter (tests see unwritten elements), empty on the GPU."""
    if interpreting():
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)
