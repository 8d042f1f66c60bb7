"""How many bytes a token costs and how many tokens fit in a memory budget, exactly.

A pool of N pages of P tokens costs, over all layers and K + V:

    N * page_bytes                       codes + scales + zeros of every page (PageLayout shapes)
  + n_seqs * fp_rows * fp_token_bytes    the full-precision buffer (sinks, window, chan residual)
  + 4 * static_scales                    per-layer float32 static / NVFP4 tensor scales

`tokens_that_fit` inverts that for a budget in GiB: it counts whole pages (a sequence's last
page may be partly empty: up to P - 1 tokens less per sequence in practice) plus the
`sink + window` full-precision tokens each of the n_seqs sequences holds.
"""
from __future__ import annotations

import math

from .layout import PageLayout
from .window import FpPolicy

_FP_BYTES = {"bf16": 2, "fp16": 2, "f16": 2, "f32": 4, "float32": 4}


def _layouts(scheme, n_layers: int, n_kv_heads: int, head_dim: int, page_size: int):
    for layer in range(n_layers):
        for pair, heads in scheme.head_groups(layer, n_layers, n_kv_heads):  # one group without per-head specs
            for spec in pair:
                yield PageLayout(spec, head_dim, page_size, len(heads))


def layout_page_bytes(lay: PageLayout) -> int:
    """Bytes of one page of one layout (codes + scales + zeros + outlier slots)."""
    n = math.prod(lay.code_shape(1)) * (2 if lay.spec.is_float_storage else 1)
    if lay.has_group_scales:
        sb = {"f16": 2, "bf16": 2, "f32": 4, "e8m0": 1, "e4m3": 1}[lay.spec.scale_dtype]
        n += math.prod(lay.scale_shape(1)) * sb * (1 if lay.spec.sym else 2)
    if lay.spec.outliers:
        n += math.prod(lay.slot_shape(1)) * 3  # uint8 index + float16 value
    return n


def page_bytes(scheme, n_layers: int, n_kv_heads: int, head_dim: int, page_size: int = 16) -> int:
    """Bytes of one page id across all layers, K and V (what one more page costs)."""
    return sum(layout_page_bytes(lay) for lay in _layouts(scheme, n_layers, n_kv_heads, head_dim, page_size))


def static_scale_count(scheme, n_layers: int) -> int:
    """float32 static values a pool keeps beside its pages (axis-tensor scales, NVFP4 tensor scales, the 16 slots of
    each calibrated codebook table)."""
    return sum(int(s.needs_tensor_scale) + 16 * int(s.calibrated)
               for layer in range(n_layers) for s in scheme.for_layer(layer, n_layers))


def fp_token_bytes(n_layers: int, n_kv_heads: int, head_dim: int, fp_bytes: int = 2) -> int:
    """Bytes of one full-precision token over all layers, K and V."""
    return 2 * n_layers * n_kv_heads * head_dim * fp_bytes


def pages_that_fit(gib: float, scheme, n_layers: int, n_kv_heads: int, head_dim: int, page_size: int = 16, *,
                   n_seqs: int = 1, fp_bytes: int = 2) -> int:
    """Pages a `gib` GiB budget holds after the fp buffers of n_seqs sequences and static scales."""
    if isinstance(fp_bytes, str):
        fp_bytes = _FP_BYTES[fp_bytes]
    budget = int(gib * 2 ** 30)
    rows = FpPolicy.of(scheme, n_layers).capacity
    fixed = n_seqs * rows * fp_token_bytes(n_layers, n_kv_heads, head_dim, fp_bytes) + 4 * static_scale_count(
        scheme, n_layers)
    return max(0, (budget - fixed) // page_bytes(scheme, n_layers, n_kv_heads, head_dim, page_size))


def tokens_that_fit(gib: float, scheme, n_layers: int, n_kv_heads: int, head_dim: int, page_size: int = 16, *,
                    n_seqs: int = 1, fp_bytes: int = 2) -> int:
    """How many tokens (summed over n_seqs sequences) fit in `gib` GiB with `scheme`.

    scheme: KVScheme or text (`"q4_0"`, `"kivi4"`, ...); fp_bytes: bytes of a full-precision
    element (2 for bf16 on GPU). Each sequence reserves `sink + window + Gc - 1` fp rows (Gc: the
    channel-group lcm, see `kvlab.cache.window`), holding `sink + window` tokens once it is long.
    Returns 0 when the fp buffers alone exceed the budget.
    """
    from ..spec import as_scheme
    scheme = as_scheme(scheme)
    if isinstance(fp_bytes, str):
        fp_bytes = _FP_BYTES[fp_bytes]
    pol = FpPolicy.of(scheme, n_layers)
    fixed = n_seqs * pol.capacity * fp_token_bytes(n_layers, n_kv_heads, head_dim, fp_bytes)
    if int(gib * 2 ** 30) < fixed:
        return 0
    n_pages = pages_that_fit(gib, scheme, n_layers, n_kv_heads, head_dim, page_size, n_seqs=n_seqs, fp_bytes=fp_bytes)
    return n_pages * page_size + n_seqs * (pol.sink + pol.window)
