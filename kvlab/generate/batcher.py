"""Continuous batching over a fixed set of decode slots; on the GPU every decode step is one CUDA-graph replay.

    b = Batcher(model, pool, slots=64, max_tokens=8192)
    for ids in prompts:
        b.submit(ids, max_new=128)               # ids: [T] int64 token ids
    res = b.run()                                # every request's tokens, prefill and decode times

Between steps, waiting requests take free slots: each group of them with one prompt length is prefilled
together in chunks (`PagedBackend`: store + extend) and yields its first token; then every step appends one
token to each busy slot (`kvlab.cache.DecodeStep` planned on the host, `StepBackend` on the device). A request
leaves when it has `max_new` tokens (no end-of-text stop: lengths are what the caller asks); its pages are
freed and its slot is taken by the next waiting request. Generated tokens stay on the device until the end
(the host never waits for a step, so it plans step t + 1 while the GPU runs step t).

The graph is captured once, on an idle plan (every write a no-op), just before the first step; it replays
on the step's fixed buffers. Kernel arguments are fixed at capture, so nothing that changes between steps
may be a launch scalar: the block table, counts and positions live in the step's device buffers.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..cache.step import DecodeStep
from .backend import PagedBackend, StepBackend


@dataclass
class Request:
    """One prompt and its generated tokens. first_token_s: seconds from `run()` start to its first token."""
    id: int
    prompt: Tensor
    max_new: int
    tokens: list = field(default_factory=list)
    slot: int | None = None
    seq: int | None = None
    first_token_s: float | None = None
    done_s: float | None = None
    _first: Tensor | None = None
    _steps: list = field(default_factory=list)  # (history index, slot) of each decode-step token


def _sync(dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


class Batcher:
    """Greedy generation for many requests through `pool` (see module doc).

    slots: decode batch (<= pool.max_seqs; default pool.max_seqs); max_tokens: longest prompt + new tokens
    (default the model's context); kernels: "triton" or "reference" (`PagedBackend`); chunk: prefill chunk;
    graphs: capture decode steps in a CUDA graph (default: on CUDA); keep: leave finished sequences in the
    pool (their slots are then not reused)."""

    def __init__(self, model, pool, slots: int | None = None, max_tokens: int | None = None, kernels: str = "triton",
                 chunk: int = 2048, graphs: bool | None = None, keep: bool = False) -> None:
        self.model, self.pool, self.kernels, self.chunk, self.keep = model, pool, kernels, chunk, keep
        self.dev = next(model.parameters()).device
        if pool.device != self.dev:
            raise ValueError(f"the pool is on {pool.device} and the model on {self.dev}")
        self.B = pool.max_seqs if slots is None else slots
        self.max_tokens = max_tokens or model.config.max_position_embeddings
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        self.graphs = self.dev.type == "cuda" if graphs is None else graphs
        if self.graphs and self.dev.type != "cuda":
            raise ValueError("graphs=True needs the model and pool on a CUDA device")
        self.step = DecodeStep(pool, self.B, self.max_tokens)
        self.backend = StepBackend(self.step, kernels)
        self.tokens_in = torch.zeros(self.B, dtype=torch.long, device=self.dev)
        self.out = torch.zeros(self.B, dtype=torch.long, device=self.dev)
        self._graph = None
        self._queue: deque[Request] = deque()
        self._next = 0

    def submit(self, prompt, max_new: int) -> int:
        """Queue a prompt ([T] token ids, T >= 1) for `max_new` >= 1 greedy tokens; returns the request id."""
        p = torch.as_tensor(prompt, dtype=torch.long).reshape(-1).cpu()
        if p.numel() < 1 or not isinstance(max_new, int) or max_new < 1:
            raise ValueError(f"a request needs a prompt of >= 1 tokens and max_new >= 1, got {p.numel()} tokens, "
                             f"max_new={max_new!r}")
        if p.numel() + max_new > self.max_tokens:
            raise ValueError(f"{p.numel()} prompt + {max_new} new tokens exceed max_tokens={self.max_tokens}")
        r = Request(self._next, p, max_new)
        self._next += 1
        self._queue.append(r)
        return r.id

    # ---- one decode step ----------------------------------------------------------------------
    def _forward(self) -> None:
        logits = self.model(self.tokens_in[:, None], positions=self.step.positions[:, None], backend=self.backend,
                            max_position=self.max_tokens - 1)
        self.out.copy_(logits[:, -1].argmax(-1))
        self.tokens_in.copy_(self.out)

    def _capture(self) -> None:
        """Warm up (compile every kernel) and capture one step on an idle plan; the live tokens are kept."""
        keep = self.tokens_in.clone()
        self.model._rope(torch.zeros(1, dtype=torch.long, device=self.dev), self.max_tokens - 1)
        self.step.plan({})
        s = torch.cuda.Stream(self.dev)
        s.wait_stream(torch.cuda.current_stream(self.dev))
        with torch.cuda.stream(s):
            for _ in range(2):
                self._forward()
        torch.cuda.current_stream(self.dev).wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            self._forward()
        self._graph = g
        self.tokens_in.copy_(keep)

    def _decode_step(self) -> None:
        if self._graph is not None:
            self._graph.replay()
        else:
            self._forward()

    # ---- admission ----------------------------------------------------------------------------
    def _prefill(self, group: list[Request], t_start: float) -> None:
        """Prefill requests of one prompt length together; their first tokens go to their slots."""
        seqs = []
        try:
            for r in group:
                seqs.append(self.pool.add_sequence(row=r.slot))
                r.seq = seqs[-1]
            be = PagedBackend(self.pool, seqs, self.kernels)
            prompts = torch.stack([r.prompt for r in group]).to(self.dev)
            T = prompts.shape[1]
            logits = None
            for i in range(0, T, self.chunk):
                j = min(T, i + self.chunk)
                logits = self.model(prompts[:, i:j], positions=torch.arange(i, j, device=self.dev), backend=be,
                                    last=1, max_position=j - 1)
        except BaseException:  # a failed prefill gives its sequences' pages and fp rows back
            for s in seqs:
                self.pool.free(s)
            for r in group:
                r.seq = None
            raise
        first = logits[:, -1].argmax(-1)  # [g]
        slots = torch.tensor([r.slot for r in group], dtype=torch.long, device=self.dev)
        self.tokens_in.index_copy_(0, slots, first)
        for k, r in enumerate(group):
            r._first = first[k]
        _sync(self.dev)
        now = time.perf_counter() - t_start
        for r in group:
            r.first_token_s = now

    def _serve(self, free: list, active: dict, history: list, t0: float, finish) -> tuple[float, int]:
        """`run`'s loop: admit (prefill) while slots are free, then one decode step for every active request.
        Returns (seconds spent in prefill and capture, decode tokens made)."""
        prefill_s, busy = 0.0, 0
        while self._queue or active:
            admit = []
            while self._queue and free:
                r = self._queue.popleft()
                r.slot = free.pop(0)
                admit.append(r)
            if not admit and not active:
                raise ValueError(f"no free slot for {len(self._queue)} waiting requests: every fp row of the pool "
                                 "is held by a sequence outside this batcher")
            if admit:
                _sync(self.dev)  # the steps queued so far count as decode time
                tp = time.perf_counter()
                by_len: dict[int, list[Request]] = {}
                for r in admit:
                    by_len.setdefault(r.prompt.numel(), []).append(r)
                for group in by_len.values():
                    self._prefill(group, t0)
                    for r in group:
                        active[r.slot] = r
                        if r.max_new == 1:
                            finish(r)
                prefill_s += time.perf_counter() - tp
            if not active:
                continue
            if self.graphs and self._graph is None:
                tp = time.perf_counter()
                self._capture()
                prefill_s += time.perf_counter() - tp  # a one-time cost, kept out of decode throughput
            self.step.plan({b: r.seq for b, r in active.items()})
            self._decode_step()
            history.append(self.out.clone())
            busy += len(active)
            for b, r in list(active.items()):
                r._steps.append((len(history) - 1, b))
                if 1 + len(r._steps) == r.max_new:
                    finish(r)
        return prefill_s, busy

    @torch.no_grad()
    def run(self) -> dict:
        """Serve every queued request. Returns {"requests": [Request] in submission order (tokens filled),
        "prefill_s", "decode_s", "decode_tokens" (tokens made by decode steps), "decode_tokens_per_s",
        "steps", "mean_busy_slots", "graphs"}."""
        free = list(range(self.B))
        for s in self.pool.seq_ids:  # rows held by sequences already in the pool are not free slots
            row = self.pool._seq(s).row
            if row in free:
                free.remove(row)
        active: dict[int, Request] = {}
        done: list[Request] = []
        history: list[Tensor] = []
        t0 = time.perf_counter()

        def finish(r: Request) -> None:
            del active[r.slot]
            r.done_s = time.perf_counter() - t0
            done.append(r)
            if not self.keep:
                self.pool.free(r.seq)
                free.append(r.slot)
                free.sort()

        try:
            prefill_s, busy = self._serve(free, active, history, t0, finish)
        except BaseException:  # nothing this run admitted stays held: free the unfinished requests' sequences
            for r in list(active.values()):
                if r.seq is not None and r.seq in self.pool._seqs:
                    self.pool.free(r.seq)
                r.seq = None
            raise
        _sync(self.dev)
        total = time.perf_counter() - t0
        H = torch.stack(history).cpu() if history else None
        for r in done:
            r.tokens = [int(r._first)] + [int(H[i, b]) for i, b in r._steps]
            r._first, r._steps = None, []
        decode_s = total - prefill_s
        n_dec = busy
        return {"requests": sorted(done, key=lambda r: r.id), "prefill_s": prefill_s, "decode_s": decode_s,
                "decode_tokens": n_dec, "decode_tokens_per_s": n_dec / decode_s if n_dec and decode_s > 0 else None,
                "steps": len(history), "mean_busy_slots": busy / len(history) if history else 0.0,
                "graphs": self._graph is not None}
