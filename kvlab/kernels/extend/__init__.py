"""Extend (chunked prefill) attention over a quantized paged prefix: `extend(...)` (see api.py)."""
from .api import extend

__all__ = ["extend"]
