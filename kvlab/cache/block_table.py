"""Block tables: which pages hold a batch's quantized tokens (CSR as FlashInfer), and slots.

    kv_indptr        int32 [B + 1]  sequence b owns kv_indices[kv_indptr[b]:kv_indptr[b + 1]]
    kv_indices       int32 [nnz]    page ids, in token order
    kv_last_page_len int32 [B]      tokens in each sequence's last page (0 when it has no pages)

A token with quantized index i of a sequence lives at slot `pages[i // P] * P + i % P`
(vLLM's slot mapping); `page` and `offset` of a slot are `slot // P` and `slot % P`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class BlockTable:
    """CSR page table of a batch (see module doc); all tensors on the pool's device."""

    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    page_size: int
    host: tuple | None = None  # (kv_indptr, kv_last_page_len) as host lists: `extend(host_lens=...)` plans from them

    @property
    def batch_size(self) -> int:
        return self.kv_indptr.numel() - 1

    def lengths(self) -> torch.Tensor:
        """Quantized tokens per sequence, int32 [B]."""
        n_pages = (self.kv_indptr[1:] - self.kv_indptr[:-1]).to(torch.int32)
        return torch.where(n_pages > 0, (n_pages - 1) * self.page_size + self.kv_last_page_len, 0).to(torch.int32)

    def padded(self, fill: int = -1) -> torch.Tensor:
        """vLLM-style per-sequence table: int32 [B, max_pages], unused entries = fill."""
        counts = (self.kv_indptr[1:] - self.kv_indptr[:-1]).long()
        width = int(counts.max()) if counts.numel() else 0
        out = torch.full((self.batch_size, width), fill, dtype=torch.int32, device=self.kv_indices.device)
        col = torch.arange(width, device=out.device)
        mask = col[None, :] < counts[:, None]
        out[mask] = self.kv_indices
        return out


def build_block_table(page_lists: list[list[int]], n_tokens: list[int], page_size: int, device="cpu") -> BlockTable:
    """CSR block table of sequences holding n_tokens[b] quantized tokens in pages page_lists[b]
    (only the first ceil(n / P) pages of each list are listed)."""
    counts = [-(-n // page_size) for n in n_tokens]
    for b, (c, pl) in enumerate(zip(counts, page_lists)):
        if c > len(pl):
            raise ValueError(f"sequence {b} holds {n_tokens[b]} tokens but only {len(pl)} pages of {page_size}")
    indptr = [0]
    for c in counts:
        indptr.append(indptr[-1] + c)
    indices = [p for c, pl in zip(counts, page_lists) for p in pl[:c]]
    last = [n - (c - 1) * page_size if c else 0 for n, c in zip(n_tokens, counts)]
    i32 = dict(dtype=torch.int32, device=device)
    return BlockTable(torch.tensor(indptr, **i32), torch.tensor(indices, **i32), torch.tensor(last, **i32), page_size,
                      host=(indptr, last))


def slots_of(pages: list[int], start: int, stop: int, page_size: int) -> list[int]:
    """Slots of quantized indices [start, stop) of a sequence holding `pages`."""
    return [pages[i // page_size] * page_size + i % page_size for i in range(start, stop)]
