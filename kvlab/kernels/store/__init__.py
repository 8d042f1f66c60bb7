"""kvlab.kernels.store: quantize + pack + scatter new tokens into KV pages.

    from kvlab.kernels.store import store
    store(x, pages, slot_mapping, spec)            # x [T, Hk, D]; pages from PageLayout.allocate

Triton is imported only when the Triton backend runs.
"""
from .api import BACKENDS, store, supports_triton

__all__ = ["store", "supports_triton", "BACKENDS"]


def _pool_store(x, pages, slots, spec, page_size, scale, tensor_scale) -> None:
    store(x, pages, slots, spec, page_size=page_size, scale=scale, tensor_scale=tensor_scale, backend="triton",
          check_slots=False)


def _register() -> None:
    from ...cache.pool import register_store_backend
    register_store_backend("triton", _pool_store)


_register()
