"""kvlab.cache: paged KV pools (page layout, block tables, allocation, full-precision window, head parts of layers
with per-head specs)."""
from .block_table import BlockTable, build_block_table
from .capacity import page_bytes, pages_that_fit, tokens_that_fit
from .head_parts import HeadPart, part_queries
from .layout import PageLayout
from .pool import KVPool, reference_store
from .pool_views import FpView, LayerCache
from .step import DecodeStep
from .window import FpPolicy

__all__ = ["PageLayout", "KVPool", "BlockTable", "build_block_table", "FpView", "LayerCache", "FpPolicy", "DecodeStep",
           "tokens_that_fit", "pages_that_fit", "page_bytes", "reference_store", "HeadPart", "part_queries"]
