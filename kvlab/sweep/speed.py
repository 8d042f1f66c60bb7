"""The sweep's speed stage (GPU): autotuned decode and store timings of one scheme at one shape.

Decode: `kvlab.kernels.tuning.tune` searches tiles/warps/stages/splits (key without the sequence
length), records the winner in the per-GPU tuned-config cache, and returns its median time.
Store: a `context`-token prefill write through the store kernel (do_bench median).
Bytes: K+V payload and scales the kernel must read (decode) or read+write (store).
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import os

import torch

LOCK_ENV = "KVLAB_TIMING_LOCK"


@contextlib.contextmanager
def timing_lock():
    """Serialize timed regions across worker processes that share a GPU (compiles stay parallel).

    The executor points $KVLAB_TIMING_LOCK at a lock file; without it this is a no-op."""
    path = os.environ.get(LOCK_ENV)
    if not path:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@functools.lru_cache(maxsize=1)
def copy_bandwidth_tbps() -> float:
    """Measured device-to-device copy bandwidth (read + write), TB/s."""
    import triton
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a), warmup=5, rep=50, return_mode="median")
    return 2 * n / ms / 1e9


def kv_bytes(sch, batch: int, context: int, heads_kv: int, head_dim: int) -> float:
    """Bytes of K and V (codes + scales + zeros; fp window at 2 B) the decode reads once."""
    per_el = sch.bits_per_element(head_dim, context=context) / 8
    return 2 * per_el * batch * context * heads_kv * head_dim


def speed_cell(sch, shape: dict, ops=("decode", "store")) -> dict:
    import triton

    from ..cache.layout import PageLayout
    from ..kernels.store import store
    from ..kernels.tuning import tune
    with timing_lock():
        out = {"gpu": torch.cuda.get_device_name(), "copy_tbps": copy_bandwidth_tbps()}
    B, L, Hk, D, P = shape["batch"], shape["context"], shape["heads_kv"], shape["head_dim"], shape["page_size"]
    if sch.k.axis == "chan" and P % sch.k.group:
        P = sch.k.group * -(-P // sch.k.group)  # pages hold whole channel groups
        out["page_size_used"] = P
    if "decode" in ops:
        tune("decode", sch, {**shape, "page_size": P}, rep=1, warmup=1, save=False)  # compile, outside the lock
        with timing_lock():
            cfg, ms = tune("decode", sch, {**shape, "page_size": P})
        nbytes = kv_bytes(sch, B, L, Hk, D)
        out.update(decode_ms=ms, decode_config=str(cfg), kv_bytes=nbytes, decode_tbps=nbytes / ms / 1e9,
                   decode_roofline_frac=(nbytes / (out["copy_tbps"] * 1e9)) / ms)
    if "store" in ops:
        T = min(L, 32768)
        x = torch.randn(T, Hk, D, device="cuda", dtype=torch.bfloat16)
        spec = sch.k
        n_pages = -(-T // P)
        pages = PageLayout(spec, D, P, Hk).allocate(n_pages, "cuda")
        slots = torch.arange(T, device="cuda", dtype=torch.int64)
        kw = {"tensor_scale": torch.ones((), device="cuda")} if spec.tensor_scale else {}
        if spec.axis == "tensor" and spec.has_scale and not spec.is_float_storage:
            kw["scale"] = torch.ones((), device="cuda")
        fn = lambda: store(x, pages, slots, spec, page_size=P, check_slots=False, **kw)  # noqa: E731
        fn()  # compile outside the lock
        with timing_lock():
            ms = triton.testing.do_bench(fn, warmup=5, rep=30, return_mode="median")
        written = sum(t.numel() * t.element_size() for t in pages.values() if t is not None)
        out.update(store_tokens=T, store_ms=ms, store_gbps=(x.numel() * 2 + written) / ms / 1e6)
    return out
