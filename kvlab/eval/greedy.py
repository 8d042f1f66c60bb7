"""Greedy generation through a quantized cache, verified in parallel against a draft.

Greedy decode through a decode-faithful cache is one token per forward: launch-bound on a GPU
(30 layers of small kernels per token). But a scheme usually generates what the full-precision
model generates, and that is cheap to check: feed prompt + draft in one decode-faithful pass
(speculative-decoding verification) and compare the argmax at each draft position. Up to the
first disagreement j the greedy output is the draft, exactly: position i's logits depend only on
tokens < i, which are the draft's. At j the quantized model's own token is known too; only the
tokens after it need incremental steps (the backend is truncated back to the verified prefix).

The draft (the full-precision greedy continuation) depends only on model and prompt, so it is
computed once per process and shared by every scheme.
"""
from __future__ import annotations

import torch
from torch import Tensor

_DRAFTS: dict = {}


def _key(model, prompt: Tensor, n_new: int) -> tuple:
    return (id(model), prompt.numel(), n_new, hash(tuple(prompt.tolist())))


@torch.no_grad()
def reference_greedy(model, prompt: Tensor, n_new: int) -> list[int]:
    """The full-precision model's greedy continuation of `prompt` [T]: n_new token ids (cached)."""
    from ..model.llama import DenseCausalBackend
    key = _key(model, prompt, n_new)
    if key not in _DRAFTS:
        dev = next(model.parameters()).device
        backend, tok, gen = DenseCausalBackend(), prompt[None].to(dev), []
        for _ in range(n_new):
            nxt = model(tok, backend=backend, last=1)[0, -1].argmax()
            gen.append(int(nxt))
            tok = nxt.view(1, 1)
        _DRAFTS[key] = gen
    return _DRAFTS[key]


@torch.no_grad()
def verify(model, prompt: Tensor, draft: list[int], backend) -> tuple[int, list[int]]:
    """One parallel pass of prompt + draft[:-1] through a fresh `backend`.

    Returns (j, argmax): argmax[i] is the model's greedy token after prompt + draft[:i], and j is
    the first i where it differs from draft[i] (len(draft) if none). The backend is left holding
    prompt + draft[:-1]."""
    if not draft:
        raise ValueError("draft must hold at least one token")
    dev = next(model.parameters()).device
    ids = torch.cat([prompt.to(dev), torch.tensor(draft[:-1], dtype=torch.int64, device=dev)])  # [T + n - 1]
    am = model(ids[None], backend=backend, last=len(draft))[0].argmax(-1).tolist()
    j = next((i for i, (a, b) in enumerate(zip(am, draft)) if a != b), len(draft))
    return j, am


@torch.no_grad()
def greedy_generate(model, prompt: Tensor, backend, n_new: int, draft: list[int] | None = None) -> list[int]:
    """Greedy continuation (n_new ids) of `prompt` [T] through `backend` (fresh; it needs a
    `truncate(n)` method when the draft is rejected), verified against `draft` (default: the
    full-precision greedy continuation). Equal to token-by-token greedy decode up to the float
    rounding that separates parallel from incremental scoring (tested)."""
    draft = reference_greedy(model, prompt, n_new) if draft is None else draft[:n_new]
    if len(draft) != n_new:
        raise ValueError(f"draft has {len(draft)} tokens, {n_new} needed")
    j, am = verify(model, prompt, draft, backend)
    if j == n_new:
        return list(draft)
    gen = list(draft[:j]) + [am[j]]
    backend.truncate(prompt.numel() + j)  # drop the rejected draft tokens
    dev = next(model.parameters()).device
    tok = torch.tensor([[am[j]]], dtype=torch.int64, device=dev)
    while len(gen) < n_new:
        nxt = model(tok, backend=backend, last=1)[0, -1].argmax()
        gen.append(int(nxt))
        tok = nxt.view(1, 1)
    return gen


def agreement(model, prompt: Tensor, backend, n_new: int) -> int:
    """Tokens generated greedily through `backend` (fresh) after `prompt` before the first
    disagreement with the full-precision model (n_new if none): one parallel pass."""
    return agreements(model, [prompt], backend, n_new)[0]


@torch.no_grad()
def agreements(model, prompts: list[Tensor], backend, n_new: int) -> list[int]:
    """`agreement` for equal-length prompts, verified as one batch [N, T + n_new - 1]."""
    if len({p.numel() for p in prompts}) != 1:
        raise ValueError(f"prompts must have one length to be batched, got {sorted({p.numel() for p in prompts})}")
    dev = next(model.parameters()).device
    drafts = [reference_greedy(model, p, n_new) for p in prompts]
    ids = torch.stack([torch.cat([p, torch.tensor(d[:-1], dtype=torch.int64)]) for p, d in zip(prompts, drafts)])
    am = model(ids.to(dev), backend=backend, last=n_new).argmax(-1).tolist()   # [N, n_new]
    return [next((i for i, (a, b) in enumerate(zip(row, d)) if a != b), n_new) for row, d in zip(am, drafts)]
