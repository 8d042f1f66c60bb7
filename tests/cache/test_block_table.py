"""CSR block tables and slot mapping."""
from __future__ import annotations

import pytest
import torch

from kvlab.cache.block_table import build_block_table, slots_of


def test_csr_layout():
    bt = build_block_table([[3, 7, 1], [], [5, 2]], [33, 0, 16], page_size=16)
    assert bt.kv_indptr.tolist() == [0, 3, 3, 4]
    assert bt.kv_indices.tolist() == [3, 7, 1, 5]
    assert bt.kv_last_page_len.tolist() == [1, 0, 16]
    assert bt.kv_indptr.dtype == bt.kv_indices.dtype == bt.kv_last_page_len.dtype == torch.int32
    assert bt.lengths().tolist() == [33, 0, 16]
    assert bt.padded().tolist() == [[3, 7, 1], [-1, -1, -1], [5, -1, -1]]


def test_too_few_pages():
    with pytest.raises(ValueError, match="only 1 pages"):
        build_block_table([[1]], [17], page_size=16)


def test_slots():
    assert slots_of([4, 9], 14, 18, 16) == [4 * 16 + 14, 4 * 16 + 15, 9 * 16, 9 * 16 + 1]
