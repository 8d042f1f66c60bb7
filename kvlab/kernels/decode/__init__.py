"""Paged decode attention over a quantized KV cache: `decode(...)` (see api.py)."""
from .api import decode

__all__ = ["decode"]
