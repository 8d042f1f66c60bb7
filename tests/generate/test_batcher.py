"""Continuous batching (kvlab.generate.Batcher): requests of different lengths join and leave a few decode slots;
every token each request gets is the decode-faithful simulation's greedy choice for that request alone (up to
float32 accumulation order), with the torch backends and with the Triton kernels (interpreter on the CPU);
finished requests give their pages and slots back."""
from __future__ import annotations

import pytest
import torch

import kvlab
from kvlab.cache import KVPool
from kvlab.eval.faithful import DecodeFaithfulBackend
from kvlab.generate import Batcher
from kvlab.generate.__main__ import page_size_for


def _greedy_under_simulation(model, scheme, prompt, tokens, tol=1e-4):
    """True when each token is the argmax of the simulation's logits (teacher-forced on `tokens`), ties
    within `tol` of the logit scale allowed."""
    be = DecodeFaithfulBackend(scheme, model.config.n_layers)
    logits = model(prompt[None], backend=be)[0, -1]
    for i, t in enumerate(tokens):
        top = logits.max()
        if logits[t] < top - tol * logits.abs().max():
            return False
        if i + 1 < len(tokens):
            logits = model(torch.tensor([[t]]), backend=be)[0, -1]
    return True


@torch.no_grad()
@pytest.mark.parametrize("scheme,kernels", [("q4_0", "reference"), ("int3:g32:asym,window=6,sink=1", "reference"),
                                            ("k=int4:g32:chan:asym,v=int4:g32:asym,window=4", "reference"),
                                            ("q4_0", "triton"),
                                            ("k=int4:g32:chan:asym,v=int4:g32:asym,window=4,L1.h0=q4_0", "reference")])
def test_requests_join_and_leave_and_get_their_own_greedy_tokens(scheme, kernels, tiny_model):
    model = tiny_model
    sch = kvlab.scheme(scheme)
    c = model.config
    pool = KVPool(sch, c.n_layers, c.n_kv_heads, c.head_dim, 64, page_size_for(sch), max_seqs=3)
    gen = torch.Generator().manual_seed(5)
    lens, news = [9, 30, 9, 17, 40], [12, 3, 7, 1, 9]
    prompts = [torch.randint(0, 64, (n,), generator=gen) for n in lens]
    b = Batcher(model, pool, slots=2, max_tokens=128, kernels=kernels, chunk=16)
    ids = [b.submit(p, m) for p, m in zip(prompts, news)]
    r = b.run()
    assert [q.id for q in r["requests"]] == ids
    assert [len(q.tokens) for q in r["requests"]] == news
    assert r["decode_tokens"] == sum(news) - len(news)  # the first token of each comes from its prefill
    assert r["steps"] < r["decode_tokens"] and r["mean_busy_slots"] > 1  # slots were shared, and reused
    assert pool.n_free_pages == pool.n_pages and pool.seq_ids == []
    for p, q in zip(prompts, r["requests"]):
        assert _greedy_under_simulation(model, sch, p, q.tokens), (q.id, q.tokens)


def test_submit_checks_its_request(tiny_model):
    model = tiny_model
    c = model.config
    pool = KVPool("q8_0", c.n_layers, c.n_kv_heads, c.head_dim, 16, 16, max_seqs=2)
    b = Batcher(model, pool, max_tokens=64, kernels="reference")
    with pytest.raises(ValueError, match="prompt of >= 1 tokens and max_new >= 1"):
        b.submit([], 3)
    with pytest.raises(ValueError, match="max_new=0"):
        b.submit([1, 2], 0)
    with pytest.raises(ValueError, match="exceed max_tokens=64"):
        b.submit(list(range(60)), 8)
    with pytest.raises(ValueError, match="graphs=True needs"):
        Batcher(model, pool, graphs=True)


def test_a_failing_prefill_leaves_nothing_held(tiny_model, monkeypatch):
    """A request whose prefill raises while others are already decoding: the error reaches the caller, and every
    sequence this run admitted (the running ones and the failing group) gives its pages and fp rows back."""
    from kvlab.generate.backend import PagedBackend
    model = tiny_model
    c = model.config
    pool = KVPool("q4_0", c.n_layers, c.n_kv_heads, c.head_dim, 64, 16, max_seqs=3)
    gen = torch.Generator().manual_seed(7)
    b = Batcher(model, pool, slots=2, max_tokens=128, kernels="reference", chunk=16)
    b.submit(torch.randint(0, 64, (9,), generator=gen), 8)  # decodes for a while
    b.submit(torch.randint(0, 64, (12,), generator=gen), 1)  # done at once: its slot frees the third request's
    b.submit(torch.randint(0, 64, (21,), generator=gen), 4)  # prefill of 21 tokens fails
    real = PagedBackend.attend

    def attend(self, layer, q, *a, **k):
        if q.shape[2] > 1 and self.pool.seq_len(self.seq_ids[0], layer) + q.shape[2] > 16:  # 21 tokens: 2nd chunk
            raise RuntimeError("kernel failed")
        return real(self, layer, q, *a, **k)
    monkeypatch.setattr(PagedBackend, "attend", attend)
    with pytest.raises(RuntimeError, match="kernel failed"):
        b.run()
    assert pool.seq_ids == [] and pool.n_free_pages == pool.n_pages
