"""Reference store (torch only, never Triton): the oracle quantizes, `kvlab.cache.paging` places.

It is the ground truth the Triton store is tested against bit for bit, and the path used for
rule=mse specs (whose grid search the kernel does not run) and on machines without Triton.
"""
from __future__ import annotations

import torch

from ...cache.paging import write_tokens


def run(x: torch.Tensor, pages: dict, slot_mapping: torch.Tensor, spec, page_size: int, *,
        scale: torch.Tensor | None = None, tensor_scale: torch.Tensor | None = None) -> None:
    """Quantize x [T, Hk, D] with `kvlab.quantize` and write codes/scales/zeros into `pages`
    (PageLayout tensors) at slot_mapping [T] (slot = page * page_size + offset; -1 skips).
    Checked inputs only: call `kvlab.kernels.store.store` for validation."""
    write_tokens(x, pages, slot_mapping, spec, page_size, scale=scale, tensor_scale=tensor_scale)
