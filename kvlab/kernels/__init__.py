"""kvlab.kernels: the attention and store ops over paged, quantized KV caches, and their tuned configs.

    from kvlab.kernels import decode, extend, store, tune, TritonDecodeConfig
    decode(q, k_pages, v_pages, kv_indptr, kv_indices, kv_last_page_len, k_spec, v_spec, page_size)

Layout: one folder per op (`decode/`, `extend/`, `store/`), each an `api.py` that checks inputs,
resolves the config and picks a backend (`reference.py`, `triton.py`, `gluon.py`) through that
backend's own `why_not`; backends import only the shared leaves (`tiles/`, `paged.py`, `checks.py`,
`configs.py`, `env.py`). `tuned.py` stores the best configs per GPU; `autotune.py` (above the apis)
searches them. Triton loads lazily: importing this package imports neither Triton nor a kernel.
"""
from .._lazy import lazy_getattr

_LAZY = {"decode": "kvlab.kernels.decode", "extend": "kvlab.kernels.extend", "store": "kvlab.kernels.store",
         "pool_store": "kvlab.kernels.store", "tune": "kvlab.kernels.autotune",
         "export_configs": "kvlab.kernels.tuned", "TritonDecodeConfig": "kvlab.kernels.configs",
         "GluonDecodeConfig": "kvlab.kernels.configs", "ExtendConfig": "kvlab.kernels.configs",
         "StoreConfig": "kvlab.kernels.configs"}
__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = list(_LAZY)
