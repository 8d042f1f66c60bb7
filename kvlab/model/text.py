"""Offline evaluation text: CPython's pydoc topics and licence files shipped with packages."""
from __future__ import annotations

import importlib.metadata as md

import torch

LICENSE_PACKAGES = ("numpy", "torch", "safetensors", "gguf")


def pydoc_topics_text() -> str:
    """The values of `pydoc_data.topics.topics` joined in sorted key order with no separator
    (~465K characters of English documentation prose on CPython 3.11)."""
    from pydoc_data.topics import topics

    return "".join(topics[k] for k in sorted(topics))


def license_text(packages: tuple[str, ...] = LICENSE_PACKAGES) -> str:
    """The largest licence file in the `*.dist-info` of the first installed package of `packages`
    (numpy's LICENSE.txt, ~48K characters, by default). Raises FileNotFoundError if none has one."""
    for pkg in packages:
        try:
            files = md.files(pkg) or []
        except md.PackageNotFoundError:
            continue
        cands = [f for f in files if f.parts and f.parts[0].endswith(".dist-info")
                 and f.name.upper().startswith(("LICENSE", "LICENCE", "COPYING"))]
        cands = [f.locate() for f in cands if f.locate().is_file()]
        if cands:
            return max(cands, key=lambda p: p.stat().st_size).read_text(encoding="utf-8")
    raise FileNotFoundError(f"no licence file found in the metadata of any of {packages}")


def _encode(tokenizer, text: str) -> list[int]:
    enc = tokenizer.encode(text, add_special_tokens=False)
    return list(getattr(enc, "ids", enc))


def tokenize_text(tokenizer, text: str, n_tokens: int) -> torch.Tensor:
    """The first `n_tokens` token ids of `text` (no BOS), int64 [n_tokens].

    tokenizer: a `tokenizers.Tokenizer` (or anything whose `encode(text, add_special_tokens=False)`
    returns ids or an object with `.ids`). Only a prefix of a long text is encoded, with a
    margin so that the cut cannot change the returned tokens.
    Raises ValueError if the whole text has fewer than n_tokens tokens.
    """
    if n_tokens <= 0:
        raise ValueError(f"n_tokens must be positive, got {n_tokens}")
    margin_tokens, margin_chars = 64, 2048
    n_chars = min(len(text), n_tokens * 6 + margin_chars)
    while True:
        ids = _encode(tokenizer, text[:n_chars])
        if n_chars >= len(text) or len(ids) >= n_tokens + margin_tokens:
            break
        n_chars = min(len(text), 2 * n_chars)
    if len(ids) < n_tokens:
        raise ValueError(f"text is too short: {len(ids)} tokens, {n_tokens} requested")
    return torch.tensor(ids[:n_tokens], dtype=torch.int64)
