"""Tokenizers for the reference models, built with the `tokenizers` package.

From a GGUF file: GPT-2 style byte-level BPE (`tokenizer.ggml.model == "gpt2"`) from
`tokenizer.ggml.tokens` + `tokenizer.ggml.merges`, with the pre-tokenizer that
`tokenizer.ggml.pre` names (SmolLM2's "smollm" = digits split one by one, then GPT-2's byte-level
regex, as in its tokenizer.json and in llama.cpp). From an HF directory: its `tokenizer.json`.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import BPE

_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# tokenizer.ggml.pre -> pre-tokenizer family (llama.cpp's llama-vocab.cpp names)
_DIGITS_THEN_GPT2 = ("smollm", "starcoder", "refact", "codeshell")
_GPT2 = ("gpt-2", "gpt2", "default", "olmo", "jais")
_SPLITS = {"llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
           "smaug-bpe": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT}
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character table (256 entries)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b), cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def pre_tokenizer_for(pre: str | None):
    """The `tokenizers` pre-tokenizer for a GGUF `tokenizer.ggml.pre` value."""
    if pre in _DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    if pre in _SPLITS:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_SPLITS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    if pre not in _GPT2 and pre is not None:
        warnings.warn(f"GGUF pre-tokenizer {pre!r} is not known to kvlab; using GPT-2's regex "
                      f"(known: {', '.join(_DIGITS_THEN_GPT2 + _GPT2 + tuple(_SPLITS))})")
    return pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)


def tokenizer_from_gguf_fields(fields: dict[str, Any]) -> Tokenizer:
    """Build a byte-level BPE `tokenizers.Tokenizer` from GGUF tokenizer fields.

    fields: the `tokenizer.ggml.*` metadata without that prefix: "model" (must be "gpt2"),
    "tokens" (list[str]), "merges" (list of "a b" str), optional "token_type" (list[int]),
    "pre", "bos_token_id", "add_bos_token". Control tokens (type 3) become special added
    tokens and user-defined ones (type 4) plain added tokens, so they are never split.
    Raises ValueError for any other tokenizer model (e.g. sentencepiece "llama").
    """
    kind = fields.get("model")
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer model {kind!r} is not supported; supported: 'gpt2' "
                         "(byte-level BPE). Use an HF directory with tokenizer.json instead.")
    if "merges" not in fields:
        raise ValueError("GGUF byte-level tokenizer has no tokenizer.ggml.merges")
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    tokens = [t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8"))
              for t in fields["tokens"]]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in fields["merges"]]
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                        end_of_word_suffix="", fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizer_for(fields.get("pre"))
    tok.decoder = decoders.ByteLevel()
    types = fields.get("token_type") or []
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(fields["tokens"], types) if ty == _CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, ty in zip(fields["tokens"], types) if ty == _USER_DEFINED])
    bos = fields.get("bos_token_id")
    if fields.get("add_bos_token") and bos is not None:
        name = fields["tokens"][bos]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{name}:0 $A:0", pair=f"{name}:0 $A:0 $B:1", special_tokens=[(name, bos)])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def tokenizer_from_hf_dir(path: str | os.PathLike) -> Tokenizer:
    """Load `tokenizer.json` from an HF model directory. Raises FileNotFoundError if absent."""
    f = Path(path).expanduser() / "tokenizer.json"
    if not f.is_file():
        raise FileNotFoundError(f"no tokenizer.json in {str(path)!r} (kvlab reads only the fast "
                                "tokenizer format; save it with tokenizer.save_pretrained)")
    return Tokenizer.from_file(str(f))
