"""Speed facts shared by the sweep and the benchmarks: the bytes a decode must read, and the
device's measured copy bandwidth (the roofline's ceiling). One definition of each."""
from __future__ import annotations

import functools

import torch


def kv_bytes(sch, batch: int, quantized_tokens: int, heads_kv: int, head_dim: int, fp_tokens: int = 0,
             fp_bytes: int = 2) -> float:
    """Bytes of K and V one decode step reads once: `quantized_tokens` per sequence in pages (codes +
    scales + zeros, at the scheme's bits per element) plus `fp_tokens` full-precision tokens of
    `fp_bytes` bytes per element."""
    q = (sch.k.bits_per_element_at(head_dim) + sch.v.bits_per_element_at(head_dim)) / 8
    return batch * heads_kv * head_dim * (quantized_tokens * q + 2 * fp_tokens * fp_bytes)


def fp_tokens_of(sch) -> int:
    """Full-precision tokens a timing cache gives each sequence: the window and sinks, at least one for
    channel-axis keys (their unfinished group)."""
    return max(sch.window + sch.sink, 1) if (sch.window or sch.sink or sch.k.axis == "chan") else 0


@functools.lru_cache(maxsize=4)
def copy_bandwidth_tbps(device: str = "cuda", n_bytes: int = 2 << 30) -> float:
    """Measured device-to-device copy bandwidth in TB/s (read + write counted), do_bench median of a
    2 GiB copy."""
    import triton.testing
    a = torch.empty(n_bytes, dtype=torch.uint8, device=device).random_()
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a), warmup=5, rep=50, return_mode="median")
    return 2 * n_bytes / ms / 1e9
