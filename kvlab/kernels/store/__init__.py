"""kvlab.kernels.store: quantize + pack + scatter new tokens into KV pages.

    from kvlab.kernels.store import store, pool_store
    store(x, pages, slot_mapping, spec)            # x [T, Hk, D]; pages from PageLayout.allocate
    KVPool(..., store=pool_store)                  # a pool that stores through the kernel

Triton is imported only when the Triton backend runs.
"""
from .api import BACKENDS, pool_store, store, supports_triton

__all__ = ["store", "pool_store", "supports_triton", "BACKENDS"]
