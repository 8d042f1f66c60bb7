"""CUDA-graph replay of batch-1 extend calls (issue 17: at batch 1 the call was host-bound).

A batch-1 extend with its lengths on the host (`host_lens`) spent about 0.6 ms of Python and launch overhead (checks,
planning, five to six launches with 15-75 arguments each) against 0.30 ms of GPU work at B 1 x 8K on the H200
(benchmarks/NOTES_extend.md), so the GPU idled half the call. Here such a call, once its key has been seen
`GRAPH_AFTER` times, is captured into a CUDA graph (plan, stacking, dequant, cuDNN, flash, merge: the same code the
eager call runs) and replayed: the host then only checks the arguments, copies the inputs into the graph's static
tensors and launches the graph. vLLM and SGLang replay graphs for the same reason (decode; SGLang's piecewise graphs for
prefill too).

What a graph may bake in, and so what its key holds:
  * host values: the chunk length, the prefix's bucket L // bucket (the dense part covers the same whole buckets for
    every L of one bucket) and whether L is a whole number of buckets (then the plan is merge-only and reads no
    remainder; otherwise the fused kernel reads the remainder with the lengths on the device), sm_scale, the config,
    the backend, the specs and page size;
  * pointers: every page tensor, the full-precision buffer and tensor scales (data_ptr, shape, strides, dtype): the
    pool's tensors stay where they are, and a replay reads what lies there then;
  * shapes and dtypes of q, k_new, v_new and of the index tensors.
Within a key the device values change between replays: q, k_new, v_new, qo_indptr, kv_indptr, kv_last_page_len and
fp_len are copied into static tensors (one `_foreach_copy_`), the block table into a static one holding the bucket's
largest page count. A replay computes what an eager call of the same plan computes; within a bucket the plan is the
one of the captured length (the covered part is the same; the fused kernel reads the rest from the device lengths).

Memory: each graph keeps its private pool (the dequant workspace: 134 MB at a 32K-token prefix, Hk 8, D 128, plus the
stacked queries and states); at most MAX_GRAPHS graphs are kept (least recently used dropped), and when keys cycle
through more graphs than that (a model's layers: each its own pages) new keys stay eager (`_thrashing`). A capture
costs a warm-up call and the capture itself (about 16 ms at B 1 x 8K on the H200). `extend(..., graphs=False)` or
KVLAB_EXTEND_GRAPHS=0 turn it off; `clear()` drops them. Replays run on the caller's current stream; calls from several
streams at once must not share a key (pass graphs=False there).

Tests run the same static-tensor plumbing on the CPU (`EMULATE`: a replay re-runs the frozen plan eagerly on the static
tensors, under the Triton interpreter), and real capture on the GPU.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import os

import torch

from ..env import interpreting

GRAPH_AFTER = 2     # eager calls of a key before it is captured (a long prompt's chunks move through buckets; a key
#                     seen a third time is a repeated shape: serving's steady state, a benchmark)
MAX_GRAPHS = 4      # graphs kept (each holds its workspace)
MAX_SEEN = 4096     # keys counted before the counts are reset
LIFE_WINDOW = 4096  # calls after which the thrash guard's counts start again
EMULATE = False     # tests: run the plumbing on the CPU, a replay re-running the frozen plan eagerly

_GRAPHS: collections.OrderedDict = collections.OrderedDict()  # key -> _Entry
_SEEN: dict = {}    # key -> eager calls so far
_FAILED: set = set()  # keys whose capture raised: they stay eager
_BUILD: list = []   # the device tables of the graph being built (`device_table`), innermost last
_LIFE = collections.Counter()  # "calls", "evicted", "replayed" in the last LIFE_WINDOW calls (the thrash guard)
STATS = collections.Counter()  # "eager", "captured", "replayed", "failed" (benchmarks report them)


def enabled() -> bool:
    """False when KVLAB_EXTEND_GRAPHS is 0 / off / false."""
    return os.environ.get("KVLAB_EXTEND_GRAPHS", "1").lower() not in ("0", "off", "false", "no")


def building() -> bool:
    """True while this module builds a graph (its warm-up call or its capture)."""
    return bool(_BUILD)


def clear() -> None:
    """Drop every graph, count and failure (frees their memory once no output refers to it)."""
    _GRAPHS.clear()
    _SEEN.clear()
    _FAILED.clear()
    _LIFE.clear()


def device_table(values: list, device) -> torch.Tensor:
    """An int32 device tensor of `values` (a host plan), copied without synchronization. While a graph is built the
    warm-up call creates it and the capture reuses that tensor (a host-to-device copy inside a capture would read a
    pinned buffer freed after the call); the graph keeps it."""
    if _BUILD:
        memo = _BUILD[-1]
        key = (tuple(values), str(device))
        t = memo.get(key)
        if t is None:
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("extend graph capture: a device table the warm-up call did not create")
            t = memo[key] = _copy_table(values, device)
        return t
    return _copy_table(values, device)


def _copy_table(values: list, device) -> torch.Tensor:
    cuda = torch.device(device).type == "cuda"
    return torch.tensor(values, dtype=torch.int32, pin_memory=cuda).to(device, non_blocking=True)


def wanted(graphs: bool, q: torch.Tensor, batch: int, host_lens, backend: str) -> bool:
    """The call is replayed through a graph: allowed (`graphs`, KVLAB_EXTEND_GRAPHS), batch 1 with host lengths, the
    auto, dense or onecall backend, on a GPU outside the interpreter and outside another capture (or EMULATE on the CPU)."""
    if not (graphs and enabled() and batch == 1 and host_lens is not None and backend in ("auto", "dense", "onecall")):
        return False
    if EMULATE:
        return not q.is_cuda
    return (q.is_cuda and not interpreting() and not building()
            and not torch.cuda.is_current_stream_capturing())


def _tensor_key(t):
    if t is None or not isinstance(t, torch.Tensor):
        return t if t is None or isinstance(t, (int, float)) else repr(t)
    return (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, str(t.device))


def _pages_key(pages: dict):
    return tuple(sorted((k, _tensor_key(v)) for k, v in pages.items()))


def call(fn, q, k_new, v_new, qo_indptr, kv, host_lens, out, static_args: tuple, bucket: int):
    """Run fn(q, k_new, v_new, qo_indptr, kv, host_lens, out, *static_args) (the dispatch after the checks) eagerly or
    through its key's graph. static_args must be hashable (sm_scale, backend, config, max_qo_len, dense_bucket);
    bucket: the prefix tokens the dense part covers in whole multiples of (the key holds L // bucket)."""
    qo, ind, last = host_lens
    P = kv.page_size
    n_pages = ind[1] - ind[0]
    L = (n_pages - 1) * P + last[0] if n_pages else 0
    key = (tuple(q.shape), q.dtype, str(q.device), tuple(k_new.shape), k_new.dtype, v_new.dtype, qo_indptr.dtype,
           kv.kv_indptr.dtype, kv.kv_indices.dtype, kv.kv_last_page_len.dtype, str(kv.k_spec), str(kv.v_spec), P,
           _pages_key(kv.k_pages), _pages_key(kv.v_pages), _tensor_key(kv.k_fp), _tensor_key(kv.v_fp),
           None if kv.fp_len is None else (tuple(kv.fp_len.shape), kv.fp_len.dtype),
           _tensor_key(kv.k_tensor_scale), _tensor_key(kv.v_tensor_scale), qo[1] - qo[0], L // bucket,
           L % bucket == 0, static_args)
    _LIFE["calls"] += 1
    if _LIFE["calls"] > LIFE_WINDOW:  # the thrash guard looks at recent calls only
        _LIFE.clear()
    entry = _GRAPHS.get(key)
    if entry is None:
        seen = _SEEN.get(key, 0)
        if key in _FAILED or seen < GRAPH_AFTER or _thrashing():
            if len(_SEEN) >= MAX_SEEN:
                _SEEN.clear()
            _SEEN[key] = seen + 1
            STATS["eager"] += 1
            return fn(q, k_new, v_new, qo_indptr, kv, host_lens, out, *static_args)
        cap = -(-((L // bucket + 1) * bucket) // P) + 1  # pages of the bucket's longest prefix
        try:
            entry = _Entry(fn, q, k_new, v_new, qo_indptr, kv, host_lens, static_args, cap)
        except Exception:  # noqa: BLE001 - a capture that fails (an op graphs do not take) leaves the call eager
            _FAILED.add(key)
            STATS["failed"] += 1
            return fn(q, k_new, v_new, qo_indptr, kv, host_lens, out, *static_args)
        _GRAPHS[key] = entry
        while len(_GRAPHS) > MAX_GRAPHS:
            _GRAPHS.popitem(last=False)
            _LIFE["evicted"] += 1
        STATS["captured"] += 1
    else:
        _GRAPHS.move_to_end(key)
        STATS["replayed"] += 1
        _LIFE["replayed"] += 1
    res = entry.replay(q, k_new, v_new, qo_indptr, kv, ind[1])
    if out is not None:
        out.copy_(res)
        return out
    return res.clone()


def _thrashing() -> bool:
    """The cache is full and has evicted more than MAX_GRAPHS graphs with fewer than four replays per eviction (keys
    cycling through more graphs than it keeps: a model's layers, each its own pages): a new key stays eager."""
    return (len(_GRAPHS) >= MAX_GRAPHS and _LIFE["evicted"] > MAX_GRAPHS
            and _LIFE["replayed"] < 4 * _LIFE["evicted"])


class _Entry:
    """One captured call: its static inputs, the graph (or, under EMULATE, the frozen eager call) and its output."""

    def __init__(self, fn, q, k_new, v_new, qo_indptr, kv, host_lens, static_args, cap: int):
        self.q, self.k, self.v = (t.clone(memory_format=torch.contiguous_format) for t in (q, k_new, v_new))
        self.qo = qo_indptr.clone()
        self.ind = kv.kv_indptr.clone()
        self.last = kv.kv_last_page_len.clone()
        self.pages = torch.zeros(cap, dtype=kv.kv_indices.dtype, device=kv.kv_indices.device)
        n = host_lens[1][1]
        self.pages[:n].copy_(kv.kv_indices[:n])
        self.fp_len = None if kv.fp_len is None else kv.fp_len.clone()
        # a tensor scale given as a number becomes a device tensor here (its value is in the key): inside the capture
        # its host-to-device copy would be refused
        ts = [t if t is None or isinstance(t, torch.Tensor) else torch.tensor([float(t)], device=q.device)
              for t in (kv.k_tensor_scale, kv.v_tensor_scale)]
        self.kv = dataclasses.replace(kv, kv_indptr=self.ind, kv_indices=self.pages, kv_last_page_len=self.last,
                                      fp_len=self.fp_len, k_tensor_scale=ts[0], v_tensor_scale=ts[1])
        frozen = tuple(list(h) for h in host_lens)
        self.tables: dict = {}
        self.graph = None

        def body():
            return fn(self.q, self.k, self.v, self.qo, self.kv, frozen, None, *static_args)
        self.body = body
        with self._building():
            if EMULATE:
                self.out = body()
                return
            side = torch.cuda.Stream(device=q.device)
            side.wait_stream(torch.cuda.current_stream(q.device))
            with torch.cuda.stream(side):
                body()  # warm-up: compiles, cuDNN plans, the device tables (kept in self.tables)
            torch.cuda.current_stream(q.device).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.out = body()

    @contextlib.contextmanager
    def _building(self):
        _BUILD.append(self.tables)
        try:
            yield
        finally:
            _BUILD.pop()

    def replay(self, q, k_new, v_new, qo_indptr, kv, n: int) -> torch.Tensor:
        """Copy this call's device values (its first n block-table entries) into the static tensors and run the
        graph; returns the static output."""
        if n > self.pages.shape[0]:
            raise RuntimeError(f"extend graph: {n} pages exceed the captured block table's {self.pages.shape[0]}")
        dst = [self.q, self.k, self.v, self.qo, self.ind, self.last, self.pages[:n]]
        src = [q, k_new, v_new, qo_indptr, kv.kv_indptr, kv.kv_last_page_len, kv.kv_indices[:n]]
        if self.fp_len is not None:
            dst.append(self.fp_len)
            src.append(kv.fp_len)
        torch._foreach_copy_(dst, src)
        if self.graph is None:  # EMULATE: the frozen plan, eagerly
            with self._building():
                self.out = self.body()
        else:
            self.graph.replay()
        return self.out
