"""Head parts: the pages of one layer split by KV head, for schemes with per-head specs (`L<i>.h<j>=`).

A layer whose KV heads all share one (K spec, V spec) pair has one part holding every head: its page dicts are the
pool's `k_pages[layer]` / `v_pages[layer]` as always. A mixed layer has one part per distinct pair (in the order of
each pair's first head), each with its own `PageLayout`s over its `len(heads)` heads; the pool's block table, page
ids, full-precision buffer (`[max_seqs, Hk, W, D]`, every head) and policy stay shared. Attention over a mixed layer
runs once per part on the part's query heads (GQA: KV head h serves query heads h * G .. h * G + G - 1) and writes
their outputs back in place (`part_queries`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .layout import PageLayout


@dataclass
class HeadPart:
    """The KV heads `heads` (ascending) of one layer that share `k_spec` / `v_spec`, and their pages.

    index: int64 [len(heads)] on the pool's device; whole: True when the part holds every head of the layer (its
    tensors need no gather)."""
    heads: tuple
    index: torch.Tensor
    k_spec: object
    v_spec: object
    k_layout: PageLayout
    v_layout: PageLayout
    k_pages: dict
    v_pages: dict
    whole: bool

    def side(self, key: str) -> tuple:
        """(spec, page dict) of the part's keys (`key` "k") or values ("v")."""
        return (self.k_spec, self.k_pages) if key == "k" else (self.v_spec, self.v_pages)

    def take(self, x: torch.Tensor | None, dim: int) -> torch.Tensor | None:
        """x restricted to this part's KV heads along `dim` (x itself for a whole part; a gathered copy else)."""
        if x is None or self.whole:
            return x
        return x.index_select(dim, self.index)


def build_parts(groups, head_dim: int, page_size: int, n_pages: int, device) -> list[HeadPart]:
    """Allocate the pages of one layer's head groups [((K spec, V spec), heads)] (`KVScheme.head_groups`)."""
    n_heads = sum(len(h) for _, h in groups)
    parts = []
    for (ks, vs), heads in groups:
        kl, vl = PageLayout(ks, head_dim, page_size, len(heads)), PageLayout(vs, head_dim, page_size, len(heads))
        parts.append(HeadPart(tuple(heads), torch.tensor(heads, dtype=torch.long, device=device), ks, vs, kl, vl,
                              kl.allocate(n_pages, device), vl.allocate(n_pages, device), len(heads) == n_heads))
    return parts


def part_queries(part: HeadPart, n_q_heads: int, n_kv_heads: int) -> torch.Tensor:
    """int64 query-head indices a part's KV heads serve (GQA groups of n_q_heads / n_kv_heads), ascending."""
    g = n_q_heads // n_kv_heads
    return (part.index[:, None] * g + torch.arange(g, device=part.index.device)[None, :]).reshape(-1)
