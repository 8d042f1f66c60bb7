"""kvlab.kernels: Triton kernels (store, decode, extend) and tuned configs. Triton loads lazily."""

_LAZY = {"store": "kvlab.kernels.store", "decode": "kvlab.kernels.decode", "extend": "kvlab.kernels.extend",
         "tune": "kvlab.kernels.tuning",
         "export_configs": "kvlab.kernels.tuning"}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'kvlab.kernels' has no attribute {name!r}")
