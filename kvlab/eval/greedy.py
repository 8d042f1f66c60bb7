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

Exact up to float rounding, which a quantized cache amplifies: one pass over T + n tokens and T
passes of one token run matmuls of different shapes, a last-bit difference moves a code across a
rounding boundary, and the logits move by up to ~0.1 (q8_0) or ~1-2 (int4) on SmolLM2 (measured,
4 x 256-token pydoc prompts). Where the top two logits are that close either pass may win: greedy
agreement is a noisy metric at this level, whichever way it is computed (its 4-segment means moved
by 0.5-2 tokens when this replaced the token-by-token loop; PPL, KL, top-1 and passkey did not).
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
    return reference_greedy_batch(model, [prompt], n_new)[0]


@torch.no_grad()
def reference_greedy_batch(model, prompts: list[Tensor], n_new: int) -> list[list[int]]:
    """reference_greedy for several prompts; those of one length are generated as one batch."""
    from ..model.llama import DenseCausalBackend
    dev = next(model.parameters()).device
    if n_new == 0:
        return [[] for _ in prompts]
    todo: dict[int, list[Tensor]] = {}
    for p in prompts:
        if _key(model, p, n_new) not in _DRAFTS:
            todo.setdefault(p.numel(), []).append(p)
    for group in todo.values():
        backend, tok, gen = DenseCausalBackend(), torch.stack(group).to(dev), []   # [N, T]
        for _ in range(n_new):
            nxt = model(tok, backend=backend, last=1)[:, -1].argmax(-1)           # [N]
            gen.append(nxt)
            tok = nxt[:, None]
        for p, row in zip(group, torch.stack(gen, 1).tolist()):
            _DRAFTS[_key(model, p, n_new)] = row
    return [list(_DRAFTS[_key(model, p, n_new)]) for p in prompts]


@torch.no_grad()
def verify(model, prompt: Tensor, draft: list[int], backend) -> tuple[int, list[int]]:
    """One parallel pass of prompt + draft[:-1] through a fresh `backend`.

    Returns (j, argmax): argmax[i] is the model's greedy token after prompt + draft[:i], and j is
    the first i where it differs from draft[i] (len(draft) if none). The backend is left holding
    prompt + draft[:-1]."""
    return verify_batch(model, [prompt], [draft], backend)[0]


@torch.no_grad()
def verify_batch(model, prompts: list[Tensor], drafts: list[list[int]], backend) -> list[tuple[int, list[int]]]:
    """`verify` for equal-length prompts and equal-length drafts, as one batch [N, T + n - 1]."""
    if len({p.numel() for p in prompts}) != 1:
        raise ValueError(f"prompts must have one length to be batched, got {sorted({p.numel() for p in prompts})}")
    n = len(drafts[0])
    if n == 0 or any(len(d) != n for d in drafts):
        raise ValueError(f"drafts must hold one number (>= 1) of tokens, got {sorted({len(d) for d in drafts})}")
    dev = next(model.parameters()).device
    ids = torch.stack([torch.cat([p.to(dev), torch.tensor(d[:-1], dtype=torch.int64, device=dev)])
                       for p, d in zip(prompts, drafts)])
    am = model(ids, backend=backend, last=n).argmax(-1).tolist()   # [N, n]
    return [(next((i for i, (a, b) in enumerate(zip(row, d)) if a != b), n), row) for row, d in zip(am, drafts)]


@torch.no_grad()
def greedy_generate(model, prompt: Tensor, backend, n_new: int, draft: list[int] | None = None) -> list[int]:
    """Greedy continuation (n_new ids) of `prompt` [T] through `backend` (fresh; it needs a
    `truncate(n)` method when the draft is rejected), verified against `draft` (default: the
    full-precision greedy continuation). Equal to token-by-token greedy decode up to the float
    rounding that separates parallel from incremental scoring (tested)."""
    if n_new == 0:
        return []
    draft = reference_greedy(model, prompt, n_new) if draft is None else draft[:n_new]
    if len(draft) != n_new:
        raise ValueError(f"draft has {len(draft)} tokens, {n_new} needed")
    j, am = verify(model, prompt, draft, backend)
    if j == n_new:
        return list(draft)
    backend.truncate(prompt.numel() + j)  # drop the rejected draft tokens; it holds prompt + draft[:j]
    dev = next(model.parameters()).device
    return _lockstep(model, backend, torch.tensor([[am[j]]], device=dev), [draft[:j] + [am[j]]], j + 1, n_new)[0]


@torch.no_grad()
def greedy_generate_batch(model, prompts: list[Tensor], make_backend, n_new: int,
                          drafts: list[list[int]] | None = None) -> list[list[int]]:
    """greedy_generate for equal-length prompts: one batched verification pass through
    `make_backend()`; the prompts whose draft is rejected then continue together in one more batch
    (`continue_batch`). Where a scheme is so noisy that its logits have near-ties, the parallel and
    the token-by-token pass may round a tie differently; both are decode-faithful."""
    if n_new == 0:
        return [[] for _ in prompts]
    drafts = reference_greedy_batch(model, prompts, n_new) if drafts is None else [d[:n_new] for d in drafts]
    out = [list(d) if j == n_new else d[:j] + [row[j]]
           for d, (j, row) in zip(drafts, verify_batch(model, prompts, drafts, make_backend()))]
    todo = [i for i, g in enumerate(out) if len(g) < n_new]
    if todo:
        for i, g in zip(todo, continue_batch(model, make_backend(), [prompts[i] for i in todo],
                                             [out[i] for i in todo], n_new)):
            out[i] = g
    return out


@torch.no_grad()
def continue_batch(model, backend, prompts: list[Tensor], known: list[list[int]], n_new: int) -> list[list[int]]:
    """Greedy continuations (n_new ids each) of equal-length prompts [T] whose first tokens are
    already known (`known[r]`, at least one each), decoded in lockstep through one fresh
    `backend`: feed every row prompt + its first m known tokens (m = the fewest known), then one
    token per step for all rows at once, a row's known token where it has one (teacher forcing)
    and its own argmax otherwise. A row's logits depend on its own tokens only, so each row equals
    its own token-by-token decode up to float rounding; the device is not synced inside the loop."""
    if len({p.numel() for p in prompts}) != 1:
        raise ValueError(f"prompts must have one length to be batched, got {sorted({p.numel() for p in prompts})}")
    if any(not 1 <= len(k) <= n_new for k in known):
        raise ValueError(f"each row needs 1..{n_new} known tokens, got {sorted({len(k) for k in known})}")
    dev = next(model.parameters()).device
    m = min(len(k) for k in known)
    tok = torch.cat([torch.stack([p.to(dev) for p in prompts]), torch.tensor([k[:m] for k in known], device=dev)], 1)
    return _lockstep(model, backend, tok, known, m, n_new)                                   # fed [R, T + m]


def _lockstep(model, backend, tok: Tensor, known: list[list[int]], m: int, n_new: int) -> list[list[int]]:
    """Feed tok [R, t], which leaves `backend` holding each row's prompt and first m tokens, then
    step all rows together to n_new tokens: a row's known token where it has one, else its argmax.
    Returns the n_new tokens of each row; one device sync, at the end."""
    dev = next(model.parameters()).device
    forced = torch.tensor([k + [0] * (n_new - len(k)) for k in known], dtype=torch.int64, device=dev)   # [R, n]
    is_known = torch.tensor([[i < len(k) for i in range(n_new)] for k in known], device=dev)             # [R, n]
    gen = [forced[:, i] for i in range(m)]
    for i in range(m, n_new):
        pred = model(tok, backend=backend, last=1)[:, -1].argmax(-1)                                      # [R]
        nxt = torch.where(is_known[:, i], forced[:, i], pred)
        gen.append(nxt)
        tok = nxt[:, None]
    return torch.stack(gen, 1).tolist()


def agreement(model, prompt: Tensor, backend, n_new: int) -> int:
    """Tokens generated greedily through `backend` (fresh) after `prompt` before the first
    disagreement with the full-precision model (n_new if none): one parallel pass."""
    return agreements(model, [prompt], backend, n_new)[0]


@torch.no_grad()
def agreements(model, prompts: list[Tensor], backend, n_new: int) -> list[int]:
    """`agreement` for equal-length prompts, verified as one batch [N, T + n_new - 1]."""
    if n_new == 0:
        return [0 for _ in prompts]
    return [j for j, _ in verify_batch(model, prompts, reference_greedy_batch(model, prompts, n_new), backend)]
