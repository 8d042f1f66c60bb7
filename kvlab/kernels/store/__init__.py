"""kvlab.kernels.store: quantize + pack + scatter new tokens into KV pages.

    from kvlab.kernels.store import store
    store(x, pages, slot_mapping, spec)            # x [T, Hk, D]; pages from PageLayout.allocate

Triton is imported only when the Triton backend runs.
"""
from .api import BACKENDS, store, supports_triton

__all__ = ["store", "supports_triton", "BACKENDS"]
