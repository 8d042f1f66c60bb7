"""kvlab.cache: paged KV pools (page layout, block tables, allocation, full-precision window)."""
from .layout import PageLayout

__all__ = ["PageLayout"]
