"""KVPool against a plain model under random workloads (issue 13, reliability).

A hypothesis state machine interleaves add_sequence, append (prefill T in 0..70, decode T = 1;
one layer or all), append_batch (a subset of the live sequences, one token each), free and bad
calls, on small pools (2-3 layers, Hk = 2, D = 16/32, few pages so that appends run out of them).
The model is a dict: sequence -> layer -> the full-precision tokens appended (in the pool's fp
dtype). After every step:

* pages: every page id is in range and either free or owned by exactly one live sequence (no
  double use, no leak), n_free_pages agrees, a sequence owns exactly the pages its quantized
  tokens need; fp-buffer rows of live sequences are distinct and the free rows are the others;
* seq_len, n_quantized, block_table (CSR indptr / indices / last_page_len, any batch order),
  slot_mapping and fp_buffer (length, held positions, values) agree with the model;
* dense_kv equals the model token by token: fp tokens (sinks, window, unfinished channel group)
  exactly, page tokens equal to kvlab.dequantize(kvlab.quantize(...)) of the same values with the
  layer's static scales, which must be what `calibrate` gives for the first tokens appended to it;
* an append fails exactly when the model says the free pages do not suffice, and every call that
  raises ValueError (out of pages, max_seqs, bad shape / dtype / layer, unknown or duplicate ids)
  leaves every page tensor, fp buffer, free list, static scale and sequence state bit-identical.
"""
from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import kvlab
from kvlab.cache import KVPool
from kvlab.cache.paging import calibrate

HK = 2
# (scheme, page sizes, head dims, layers): page sizes of chan schemes are multiples of the channel group
CASES = [
    ("q4_0", [1, 8, 16], [32], [2, 3]),
    ("q4_0,window=4,sink=2", [1, 8, 16], [32], [2, 3]),
    ("k=int4:g8:chan:asym,v=int4:g8:asym,window=3", [8, 16], [16, 32], [2, 3]),  # kivi4 style
    ("nvfp4", [1, 8, 16], [16, 32], [2, 3]),
    ("k=q8_0,v=int2:g16:asym,sink=3", [1, 8, 16], [32], [2, 3]),
    ("fp8_e4m3:tensor:rule=absmax,sink=1,window=2", [1, 8], [16], [2]),
    ("k=int4:g8:chan:asym,v=int2:g16:chan:sym,sink=1,window=2", [16, 32], [16], [2]),
    ("q4_1,L0=bf16,L-1=int3:g32:asym", [1, 16], [32], [3]),
]
# deterministic by default (fast, no flakes); KVLAB_POOL_FUZZ=N runs N fresh random examples per scheme
_FUZZ = int(os.environ.get("KVLAB_POOL_FUZZ", "0"))
SETTINGS = settings(max_examples=_FUZZ or 30, stateful_step_count=35, deadline=None, derandomize=not _FUZZ,
                    database=None, suppress_health_check=list(HealthCheck))


# ---- snapshots of the whole pool state ---------------------------------------------------------
def _bytes(t):
    return None if t is None else t.detach().reshape(-1).clone().view(torch.uint8)


def snapshot(pool: KVPool):
    return {
        "pages": [{k: _bytes(t) for k, t in d.items()} for d in (*pool.k_pages, *pool.v_pages)],
        "fp": [_bytes(t) for t in (*pool.k_fp, *pool.v_fp)],
        "static": [{k: (_bytes(v) if isinstance(v, torch.Tensor) else v) for k, v in d.items()} for d in pool._static],
        "free": list(pool._free),
        "free_rows": list(pool._free_rows),
        "next_id": pool._next_id,
        "seqs": {s: (q.row, list(q.pages), list(q.n), [list(r) for r in q.rows]) for s, q in pool._seqs.items()},
    }


def assert_same(a, b, what):
    for key in a:
        x, y = a[key], b[key]
        if key in ("pages", "static"):
            for i, (dx, dy) in enumerate(zip(x, y)):
                assert dx.keys() == dy.keys()
                for k in dx:
                    if isinstance(dx[k], torch.Tensor) or isinstance(dy[k], torch.Tensor):
                        assert dx[k] is not None and dy[k] is not None and torch.equal(dx[k], dy[k]), \
                            f"{what} changed {key}[{i}][{k}]"
                    else:
                        assert dx[k] == dy[k], f"{what} changed {key}[{i}][{k}]"
        elif key == "fp":
            for i, (tx, ty) in enumerate(zip(x, y)):
                assert torch.equal(tx, ty), f"{what} changed fp buffer {i}"
        else:
            assert x == y, f"{what} changed {key}: {x} -> {y}"


# ---- the model's view of a (sequence, layer) -----------------------------------------------------
def expected_dense(pool: KVPool, layer: int, K: torch.Tensor, V: torch.Tensor):
    """(k, v) float32 [Hk, n, D]: K, V [n, Hk, D] (fp dtype) with the page tokens through the oracle."""
    S, nq = pool.policy.sink, pool.policy.n_quantized(K.shape[0])
    lc = pool.layer_cache(layer)
    out = []
    for X, spec, s, ts in ((K, lc.k_spec, lc.k_scale, lc.k_tensor_scale),
                           (V, lc.v_spec, lc.v_scale, lc.v_tensor_scale)):
        x = X.float().transpose(0, 1).clone()
        if nq:
            kw = {}
            if spec.static_scale:
                kw["scale"] = s
            if spec.tensor_scale:
                kw["tensor_scale"] = ts
            x[:, S:S + nq] = kvlab.dequantize(kvlab.quantize(x[:, S:S + nq].clone(), spec, **kw)).float()
        out.append(x)
    return out


def same(a, b):
    """Elementwise a == b, NaN equal to NaN."""
    return (a == b) | (a.isnan() & b.isnan())


def ceil_div(a, b):
    return -(-a // b)


def make_machine(scheme: str, page_sizes, head_dims, layer_counts, stats: dict):
    class PoolMachine(RuleBasedStateMachine):
        @initialize(page_size=st.sampled_from(page_sizes), head_dim=st.sampled_from(head_dims),
                    n_layers=st.sampled_from(layer_counts), capacity=st.integers(8, 100),
                    max_seqs=st.integers(2, 4), fp_dtype=st.sampled_from([torch.float32, torch.bfloat16]),
                    seed=st.integers(0, 2 ** 16))
        def setup(self, page_size, head_dim, n_layers, capacity, max_seqs, fp_dtype, seed):
            n_pages = max(1, capacity // page_size)
            self.pool = KVPool(scheme, n_layers, HK, head_dim, n_pages=n_pages, page_size=page_size,
                               max_seqs=max_seqs, fp_dtype=fp_dtype)
            self.L, self.D, self.P = n_layers, head_dim, page_size
            self.model: dict[int, list[list[torch.Tensor]]] = {}  # seq -> layer -> [K [n, Hk, D], V]
            self.calib: list = [None] * n_layers  # first tokens appended to each layer (k, v)
            self.freed: list[int] = []
            self.g = torch.Generator().manual_seed(seed)
            self._want = {}

        # ---- helpers ----
        def _kv(self, T, dtype=torch.float32, mult=1.0, poison=False):
            """Random k, v [T, Hk, D]; poison: a few entries NaN / +-inf (the pool's non-finite contract)."""
            out = []
            for _ in range(2):
                x = torch.randn(T, HK, self.D, generator=self.g) * mult
                if poison and x.numel():
                    idx = torch.randint(0, x.numel(), (max(1, x.numel() // 64),), generator=self.g)
                    bad = torch.tensor([float("nan"), float("inf"), float("-inf")])
                    x.view(-1)[idx] = bad[torch.arange(idx.numel()) % 3]
                out.append(x.to(dtype))
            return out

        def _need(self, items, layer):
            """Pages the model says an append of [(seq, T)] at `layer` takes from the free list."""
            pol = self.pool.policy
            need = 0
            for s, T in items:
                n = self.model[s][layer][0].shape[0]
                held = len(self.pool.pages_of(s))
                need += max(0, ceil_div(pol.n_quantized(n + T), self.P) - held) if T else 0
            return need

        def _record(self, layer, items):
            """Successful append of [(seq, k, v)] (input dtype) at `layer`: update the model."""
            fp = self.pool.fp_dtype
            items = [(s, k.to(fp), v.to(fp)) for s, k, v in items]
            for s, k, v in items:
                K, V = self.model[s][layer]
                self.model[s][layer] = [torch.cat([K, k]), torch.cat([V, v])]
            nonempty = [(k, v) for _, k, v in items if k.shape[0]]
            if nonempty and self.calib[layer] is None:
                self.calib[layer] = (torch.cat([k for k, _ in nonempty]), torch.cat([v for _, v in nonempty]))

        def _expect_error(self, fn, match=None, what="bad call"):
            before = snapshot(self.pool)
            with pytest.raises(ValueError, match=match):
                fn()
            assert_same(before, snapshot(self.pool), what)
            stats["errors"] += 1

        def _try_append(self, layer, items, batch):
            """items [(seq, k, v)]: append (batch: append_batch) and check against the model's page count."""
            need = self._need([(s, k.shape[0]) for s, k, _ in items], layer)
            fits = need <= self.pool.n_free_pages
            if batch:
                ids = [s for s, _, _ in items]
                k = torch.cat([k for _, k, _ in items]) if items else torch.zeros(0, HK, self.D)
                v = torch.cat([v for _, _, v in items]) if items else torch.zeros(0, HK, self.D)
                call = lambda: self.pool.append_batch(ids, layer, k, v)
            else:
                (s, k, v), = items
                call = lambda: self.pool.append(s, layer, k, v)
            if not fits:
                self._expect_error(call, "out of pages", "failed append")
                stats["out_of_pages"] += 1
                return False
            call()
            self._record(layer, items)
            stats["appends"] += 1
            return True

        # ---- rules ----
        @precondition(lambda self: len(self.model) < self.pool.max_seqs)
        @rule()
        def add_sequence(self):
            s = self.pool.add_sequence()
            assert s not in self.model and s not in self.freed
            self.model[s] = [[torch.zeros(0, HK, self.D, dtype=self.pool.fp_dtype)] * 2 for _ in range(self.L)]

        def _append_one(self, data, T, all_layers, dtype, mult, poison=False):
            s = data.draw(st.sampled_from(sorted(self.model)), label="seq")
            layers = range(self.L) if all_layers else [data.draw(st.integers(0, self.L - 1), label="layer")]
            k, v = self._kv(T, dtype, mult, poison)
            for layer in layers:
                self._try_append(layer, [(s, k, v)], batch=False)

        @precondition(lambda self: self.model)
        @rule(data=st.data(), T=st.integers(0, 70), all_layers=st.booleans(),
              dtype=st.sampled_from([torch.float32, torch.float32, torch.float16, torch.bfloat16]),
              mult=st.sampled_from([1.0, 1.0, 1.0, 0.0, 1e-3, 40.0]), poison=st.sampled_from([False] * 5 + [True]))
        def prefill(self, data, T, all_layers, dtype, mult, poison):
            self._append_one(data, T, all_layers, dtype, mult, poison)

        @precondition(lambda self: self.model)
        @rule(data=st.data(), all_layers=st.booleans(), dtype=st.sampled_from([torch.float32, torch.bfloat16]))
        def decode(self, data, all_layers, dtype):
            self._append_one(data, 1, all_layers, dtype, 1.0)

        @precondition(lambda self: self.model)
        @rule(data=st.data(), all_layers=st.booleans())
        def append_batch(self, data, all_layers):
            live = sorted(self.model)
            ids = data.draw(st.lists(st.sampled_from(live), min_size=1, max_size=len(live), unique=True), label="ids")
            k, v = self._kv(len(ids))
            layers = range(self.L) if all_layers else [data.draw(st.integers(0, self.L - 1), label="layer")]
            for layer in layers:
                self._try_append(layer, [(s, k[b:b + 1], v[b:b + 1]) for b, s in enumerate(ids)], batch=True)

        @precondition(lambda self: self.model)
        @rule(data=st.data())
        def free(self, data):
            s = data.draw(st.sampled_from(sorted(self.model)), label="seq")
            self.pool.free(s)
            del self.model[s]
            self.freed.append(s)

        @precondition(lambda self: self.model)
        @rule(kind=st.sampled_from(["add_full", "heads", "head_dim", "rank", "tv_tokens", "dtype", "unknown_seq",
                                    "layer", "dup_batch", "batch_len", "batch_unknown", "batch_bad_v",
                                    "free_unknown", "batch_layer"]),
              T=st.integers(1, 40))
        def bad_call(self, kind, T):
            pool, live = self.pool, sorted(self.model)
            k, v = self._kv(T)
            unknown = self.freed[-1] if self.freed else pool._next_id + 7
            if kind == "add_full":
                if len(live) < pool.max_seqs:
                    return
                self._expect_error(pool.add_sequence, "max_seqs", "add_sequence past max_seqs")
                return
            s = live[-1]
            kb, vb = self._kv(len(live) + 1)
            calls = {
                "heads": (lambda: pool.append(s, 0, torch.randn(T, HK + 1, self.D), v), "must be a tensor"),
                "head_dim": (lambda: pool.append(s, 0, k, torch.randn(T, HK, self.D + 1)), "must be a tensor"),
                "rank": (lambda: pool.append(s, 0, k[:, 0], v), "must be a tensor"),
                "tv_tokens": (lambda: pool.append(s, 0, k, torch.cat([v, v[:1]])), "tokens but v has"),
                "dtype": (lambda: pool.append(s, 0, k, v.to(torch.int32)), "dtype"),
                "unknown_seq": (lambda: pool.append(unknown, 0, k, v), "unknown sequence id"),
                "layer": (lambda: pool.append(s, self.L, k, v), "layer must be"),
                "batch_layer": (lambda: pool.append_batch(live, -1, kb[:len(live)], vb[:len(live)]), "layer must be"),
                "dup_batch": (lambda: pool.append_batch([*live, s], 0, kb, vb), "appears twice"),
                "batch_len": (lambda: pool.append_batch(live, 0, kb, vb), "sequence ids for"),
                "batch_unknown": (lambda: pool.append_batch([*live, unknown], 0, kb, vb), "unknown sequence id"),
                "batch_bad_v": (lambda: pool.append_batch(live, 0, kb[:len(live)], vb[:len(live), :1]),
                                "must be a tensor"),
                "free_unknown": (lambda: pool.free(unknown), "unknown sequence id"),
            }
            fn, match = calls[kind]
            self._expect_error(fn, match, f"bad call {kind}")

        # ---- invariants ----
        @invariant()
        def pages_and_rows(self):
            if not hasattr(self, "pool"):
                return
            pool, live = self.pool, sorted(self.model)
            assert pool.seq_ids == live
            owned = [p for s in live for p in pool.pages_of(s)]
            free = list(pool._free)
            assert all(isinstance(p, int) and 0 <= p < pool.n_pages for p in owned + free), "page id out of range"
            assert len(set(owned)) == len(owned), "a page is used twice"
            assert len(set(free)) == len(free), "a page is free twice"
            assert not set(owned) & set(free), "a page is both free and owned"
            assert len(owned) + len(free) == pool.n_pages, "a page leaked"
            assert pool.n_free_pages == len(free)
            rows = [pool._seqs[s].row for s in live]
            assert sorted(rows + list(pool._free_rows)) == list(range(pool.max_seqs)), "fp rows leaked or shared"
            for s in live:
                nq = max(pool.policy.n_quantized(self.model[s][layer][0].shape[0]) for layer in range(self.L))
                assert len(pool.pages_of(s)) == ceil_div(nq, self.P), "pages are taken exactly when needed"

        @invariant()
        def tokens_match_model(self):
            if not hasattr(self, "pool"):
                return
            pool, live, P = self.pool, sorted(self.model), self.P
            S, W = pool.policy.sink, pool.policy.capacity
            for layer in range(self.L):
                if self.calib[layer] is not None:  # static scales come from the first tokens appended
                    lc = pool.layer_cache(layer)
                    for x, spec, scale, ts in ((self.calib[layer][0], lc.k_spec, lc.k_scale, lc.k_tensor_scale),
                                               (self.calib[layer][1], lc.v_spec, lc.v_scale, lc.v_tensor_scale)):
                        want_s, want_ts = calibrate(x, spec)
                        if spec.static_scale:
                            assert torch.equal(scale, want_s)
                        if spec.tensor_scale:
                            assert torch.equal(ts, want_ts)
                else:
                    assert not pool._static[layer]["set"], "a layer was calibrated without a successful append"
                if not live:
                    continue
                ns = [self.model[s][layer][0].shape[0] for s in live]
                nqs = [pool.policy.n_quantized(n) for n in ns]
                for order in (live, live[::-1]):  # CSR over any batch order
                    bt = pool.block_table(order, layer)
                    indptr, idx = bt.kv_indptr.tolist(), bt.kv_indices.tolist()
                    assert indptr[0] == 0 and len(indptr) == len(order) + 1
                    for b, s in enumerate(order):
                        nq = pool.policy.n_quantized(self.model[s][layer][0].shape[0])
                        c = ceil_div(nq, P)
                        assert indptr[b + 1] - indptr[b] == c
                        assert idx[indptr[b]:indptr[b + 1]] == pool.pages_of(s)[:c]
                        assert int(bt.kv_last_page_len[b]) == (nq - (c - 1) * P if c else 0)
                    assert bt.lengths().tolist() == [pool.n_quantized(s, layer) for s in order]
                fp = pool.fp_buffer(layer, live)
                assert fp.k.shape == (len(live), HK, W, self.D) and fp.positions.shape == (len(live), W)
                for b, (s, n, nq) in enumerate(zip(live, ns, nqs)):
                    assert pool.seq_len(s, layer) == n and pool.n_quantized(s, layer) == nq
                    K, V = self.model[s][layer]
                    m = int(fp.length[b])
                    pos = fp.positions[b, :m].tolist()
                    assert m == n - nq and (fp.positions[b, m:] == -1).all()
                    assert sorted(pos) == [*range(min(S, n)), *range(S + nq, n)], "fp buffer holds the wrong tokens"
                    assert same(fp.k[b, :, :m], K[pos].transpose(0, 1)).all()
                    assert same(fp.v[b, :, :m], V[pos].transpose(0, 1)).all()
                    if nq:
                        i = torch.arange(nq)
                        pages = torch.tensor(pool.pages_of(s))
                        assert torch.equal(pool.slot_mapping(s, range(S, S + nq), layer), pages[i // P] * P + i % P)
                    key = (s, layer)
                    if key not in self._want or self._want[key][0] != n:
                        self._want[key] = (n, expected_dense(pool, layer, K, V))
                    got = pool.dense_kv(s, layer)
                    for name, g_, w_ in zip("kv", got, self._want[key][1]):
                        assert g_.dtype == torch.float32 and g_.shape == (HK, n, self.D)
                        bad = (~same(g_, w_)).any(-1).any(0).nonzero().flatten().tolist()
                        assert not bad, f"seq {s} layer {layer} {name}: tokens {bad[:10]} of {n} differ (sink {S}, " \
                                        f"{nq} quantized)"
                stats["quantized_tokens"] = max(stats["quantized_tokens"], max(nqs))

    return PoolMachine


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("scheme,page_sizes,head_dims,layers", CASES, ids=[c[0] for c in CASES])
def test_pool_random_workload(scheme, page_sizes, head_dims, layers):
    stats = {"appends": 0, "out_of_pages": 0, "errors": 0, "quantized_tokens": 0}
    run_state_machine_as_test(make_machine(scheme, page_sizes, head_dims, layers, stats), settings=SETTINGS)
    # the workload is not vacuous: appends succeed, run out of pages, quantize tokens, and bad calls are made
    assert stats["appends"] > 0 and stats["out_of_pages"] > 0 and stats["quantized_tokens"] > 0
    assert stats["errors"] > stats["out_of_pages"], stats


def test_append_keeps_values_not_autograd_history():
    """Inputs that require grad (a model run without no_grad) are stored as values: the pool's fp
    buffers and page scales must not join, and keep alive, the callers' autograd graphs."""
    pool = KVPool("k=int4:g8:chan:asym,v=int4:g8:asym,window=3", 2, HK, 16, n_pages=8, page_size=8, max_seqs=2)
    a, b = pool.add_sequence(), pool.add_sequence()
    w = torch.ones((), requires_grad=True)
    for t in range(20):
        x = torch.randn(1 + 5 * (t == 0), HK, 16) * w
        pool.append(a, t % 2, x, x)
        pool.append_batch([a, b], 0, torch.cat([x[:1], x[:1]]), torch.cat([x[:1], x[:1]]))
    held = [*pool.k_fp, *pool.v_fp, *(t for d in (*pool.k_pages, *pool.v_pages) for t in d.values() if t is not None)]
    assert not any(t.requires_grad or t.grad_fn is not None for t in held)
    assert not any(t.requires_grad for s in (a, b) for layer in range(2) for t in pool.dense_kv(s, layer))
    assert pool.n_quantized(a, 0) > 0
