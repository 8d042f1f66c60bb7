"""Evaluation segments start with the tokenizer's BOS where the model's tokenizer adds one (Gemma 3), and are
unchanged where it adds none (SmolLM2)."""
from __future__ import annotations

import pytest
import torch

from kvlab.eval.perplexity import bos_prefix, segments


class _Tok:
    def __init__(self, head, tail=()):
        self.head, self.tail = head, tail

    def encode(self, text, add_special_tokens=True):
        body = [100 + ord(ch) for ch in text]
        return list(self.head) + body + list(self.tail) if add_special_tokens else body


def test_bos_prefix_reads_the_tokenizer():
    assert bos_prefix(_Tok([2])) == [2]
    assert bos_prefix(_Tok([])) == []
    assert bos_prefix(_Tok([2], tail=[1])) == [2]  # an appended EOS is not part of the prefix
    assert bos_prefix(_Tok([], tail=[1])) == []


def test_segments_with_bos_keep_their_length_and_stay_disjoint():
    toks = torch.arange(100, 200)
    plain = segments(toks, 10, 3)
    assert [s.tolist() for s in plain] == [list(range(100, 110)), list(range(110, 120)), list(range(120, 130))]
    with_bos = segments(toks, 10, 3, prefix=[2])
    assert [s.tolist() for s in with_bos] == [[2] + list(range(100, 109)), [2] + list(range(109, 118)),
                                             [2] + list(range(118, 127))]


def test_segments_refuse_a_prefix_that_fills_them():
    with pytest.raises(ValueError, match="no room after the prefix"):
        segments(torch.arange(50), 1, 2, prefix=[2])
