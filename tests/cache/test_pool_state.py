"""KVPool invariants under random add / append / append_batch / free workloads (hypothesis state machine).

Invariants after every step: every page is free or owned by exactly one live sequence (no leak,
no double use); a sequence owns exactly the pages its quantized tokens need; token counts, fp
lengths and block tables agree; dense_kv equals the oracle over the tokens appended (fp tokens
exactly, page tokens through kvlab.quantize). A failed append (out of pages) changes nothing.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import kvlab
from kvlab.cache import KVPool

L, HK, D, P = 2, 1, 16, 8
SCHEMES = ["k=int4:g8:chan:asym,v=int4:g8:asym,window=3,sink=1", "int3:g8:asym,window=2",
           "k=int2:g8:chan:sym,v=bf16", "fp8_e4m3:tensor:rule=absmax,sink=2,window=1",
           "int4:g16:sym:rule=signed:recip:rnd=up:pack=ggml"]


class PoolMachine(RuleBasedStateMachine):
    @initialize(scheme=st.sampled_from(SCHEMES), n_pages=st.integers(2, 10))
    def setup(self, scheme, n_pages):
        self.pool = KVPool(scheme, L, HK, D, n_pages=n_pages, page_size=P, max_seqs=3)
        self.tokens: dict[int, list[list]] = {}  # seq -> layer -> [(k, v) chunks]
        self.g = torch.Generator().manual_seed(n_pages)

    def _kv(self, T):
        return torch.randn(T, HK, D, generator=self.g), torch.randn(T, HK, D, generator=self.g)

    @precondition(lambda self: len(self.tokens) < 3)
    @rule()
    def add(self):
        self.tokens[self.pool.add_sequence()] = [[] for _ in range(L)]

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), T=st.one_of(st.just(1), st.integers(0, 30)), all_layers=st.booleans())
    def append(self, data, T, all_layers):
        sid = data.draw(st.sampled_from(sorted(self.tokens)))
        layers = range(L) if all_layers else [data.draw(st.integers(0, L - 1))]
        k, v = self._kv(T)
        for layer in layers:
            before = (self.pool.seq_len(sid, layer), self.pool.pages_of(sid), self.pool.n_free_pages)
            try:
                self.pool.append(sid, layer, k, v)
            except ValueError as e:
                assert "out of pages" in str(e)
                assert (self.pool.seq_len(sid, layer), self.pool.pages_of(sid), self.pool.n_free_pages) == before
                continue
            self.tokens[sid][layer].append((k, v))

    @precondition(lambda self: self.tokens)
    @rule(layer=st.integers(0, L - 1))
    def decode_step(self, layer):
        ids = sorted(self.tokens)
        k, v = self._kv(len(ids))
        try:
            self.pool.append_batch(ids, layer, k, v)
        except ValueError as e:
            assert "out of pages" in str(e)
            return
        for b, s in enumerate(ids):
            self.tokens[s][layer].append((k[b:b + 1], v[b:b + 1]))

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free(self, data):
        sid = data.draw(st.sampled_from(sorted(self.tokens)))
        self.pool.free(sid)
        del self.tokens[sid]

    @invariant()
    def pages_partition(self):
        if not hasattr(self, "pool"):
            return
        owned = [p for s in self.tokens for p in self.pool.pages_of(s)]
        free = self.pool._free
        assert len(set(owned)) == len(owned), "a page is used twice"
        assert not set(owned) & set(free), "a page is both free and owned"
        assert sorted(owned + free) == list(range(self.pool.n_pages)), "a page leaked"
        assert self.pool.seq_ids == sorted(self.tokens)

    @invariant()
    def counts_and_values(self):
        if not hasattr(self, "pool"):
            return
        pool = self.pool
        for s, layers in self.tokens.items():
            nqs = []
            for layer, chunks in enumerate(layers):
                n = sum(k.shape[0] for k, _ in chunks)
                nq = pool.policy.n_quantized(n)
                nqs.append(nq)
                assert pool.seq_len(s, layer) == n and pool.n_quantized(s, layer) == nq
                assert int(pool.fp_buffer(layer, [s]).length[0]) == n - nq
                assert pool.block_table([s], layer).lengths().tolist() == [nq]
            assert len(pool.pages_of(s)) == -(-max(nqs) // P), "pages are allocated exactly when needed"
        if self.tokens:  # values of one sequence / layer
            s = max(self.tokens)
            layer = len(self.tokens[s][0]) % L
            chunks = self.tokens[s][layer]
            if chunks:
                K = torch.cat([k for k, _ in chunks]).transpose(0, 1)
                k, _ = pool.dense_kv(s, layer)
                S, nq = pool.policy.sink, pool.n_quantized(s, layer)
                lc = pool.layer_cache(layer)
                want = K.clone()
                if nq:
                    kw = {"scale": lc.k_scale} if lc.k_scale is not None else {}
                    want[:, S:S + nq] = kvlab.dequantize(kvlab.quantize(K[:, S:S + nq], lc.k_spec, **kw)).float()
                assert torch.equal(k, want)


TestPoolMachine = pytest.mark.filterwarnings("ignore::RuntimeWarning")(PoolMachine.TestCase)
TestPoolMachine.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
