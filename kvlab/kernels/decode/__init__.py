"""Paged decode attention over a quantized KV cache: `decode(...)` (see api.py)."""
from .api import decode, last_dispatch

__all__ = ["decode", "last_dispatch"]
