"""kvlab: design, measure and ship KV-cache quantization schemes.

    import kvlab
    s = kvlab.scheme("k=int4:g32:chan:asym,v=int4:g32:asym,window=128")
    q = kvlab.quantize(x, s.k); y = kvlab.dequantize(q)
    b = kvlab.encode(x, kvlab.scheme("q4_0").k)     # the bytes llama.cpp stores

The spec layer is pure Python; the oracle (torch) is imported on first use.
"""
from ._lazy import lazy_getattr
from .spec import KVQuantSpec, KVScheme, grid, parse_spec, scheme

__version__ = "0.1.0"

_LAZY = {"quantize": "kvlab.quant", "dequantize": "kvlab.quant", "encode": "kvlab.quant", "decode_bytes": "kvlab.quant",
         "QTensor": "kvlab.quant"}
__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = ["KVQuantSpec", "KVScheme", "scheme", "grid", "parse_spec", *_LAZY, "__version__"]
