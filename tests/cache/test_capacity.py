"""Bytes per token and tokens that fit in a budget, exactly."""
from __future__ import annotations

import pytest
import torch

import kvlab
from kvlab.cache import KVPool, page_bytes, pages_that_fit, tokens_that_fit


@pytest.mark.parametrize("name", ["q4_0", "q8_0", "bf16", "fp8_e4m3", "nvfp4", "kivi4", "int3:g32:asym", "mxfp4"])
def test_page_bytes_match_bits_per_element(name):
    s = kvlab.scheme(name)
    L, Hk, D, P = 3, 2, 128, 32
    bpe = s.bits_per_element(D)  # mean of K and V (no window, no overrides)
    assert page_bytes(s, L, Hk, D, P) == pytest.approx(L * 2 * Hk * D * P * bpe / 8)


def test_tokens_that_fit_numbers():
    # q4_0: 4.5 bits/elem -> 32 layers * 2 * 8 heads * 128 * 4.5 / 8 = 36864 bytes per token
    assert tokens_that_fit(80, "q4_0", 32, 8, 128) == (80 * 2 ** 30 // (36864 * 16)) * 16
    assert tokens_that_fit(80, "bf16", 32, 8, 128) == 80 * 2 ** 30 // 131072
    # kivi4: 128 + 31 bf16 rows per sequence are reserved; the 128 window tokens count as held
    fp_row = 2 * 32 * 8 * 128 * 2
    n_pages = (80 * 2 ** 30 - 64 * 159 * fp_row) // page_bytes(kvlab.scheme("kivi4"), 32, 8, 128, 32)
    assert tokens_that_fit(80, "kivi4", 32, 8, 128, 32, n_seqs=64) == n_pages * 32 + 64 * 128
    assert tokens_that_fit(0.001, "kivi4", 32, 8, 128, 32, n_seqs=64) == 0
    assert tokens_that_fit(1, "q4_0", 32, 8, 128) > tokens_that_fit(1, "q8_0", 32, 8, 128) > \
        tokens_that_fit(1, "bf16", 32, 8, 128)


def test_overrides_and_static_scales_count():
    s = kvlab.scheme("q4_0,L0=bf16")
    assert page_bytes(s, 4, 2, 64, 16) == (3 * 36 + 128) * 2 * 2 * 16
    assert pages_that_fit(1e-3, kvlab.scheme("nvfp4"), 2, 2, 64, fp_bytes=2) > 0


@pytest.mark.parametrize("name", ["q4_0", "kivi4", "nvfp4,window=8,sink=4"])
def test_pool_from_memory_fits_budget(name):
    gib = 0.004
    pool = KVPool.from_memory(gib, name, 2, 2, 64, 32, max_seqs=3)
    assert pool.nbytes() <= gib * 2 ** 30
    one_more = pool.nbytes() + page_bytes(pool.scheme, 2, 2, 64, 32)
    assert one_more > gib * 2 ** 30
    assert pool.bytes_per_token() == page_bytes(pool.scheme, 2, 2, 64, 32) / 32
    assert pool.fp_bytes_per_token() == 2 * 2 * 2 * 64 * torch.empty(0, dtype=pool.fp_dtype).element_size()
