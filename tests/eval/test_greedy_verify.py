"""Greedy generation by parallel verification == token-by-token greedy decode through the same
decode-faithful cache, including rejected drafts (backend truncation) and channel groups."""
import pytest
import torch

import kvlab
from kvlab.eval.faithful import DecodeFaithfulBackend
from kvlab.eval.greedy import agreement, greedy_generate, reference_greedy, verify
from kvlab.eval.perplexity import text_tokens

pytest.importorskip("gguf")


def _incremental(model, prompt, backend, n_new):
    tok, gen = prompt[None], []
    for _ in range(n_new):
        nxt = model(tok, backend=backend)[0, -1].argmax()
        gen.append(int(nxt))
        tok = nxt.view(1, 1)
    return gen


# 8-bit and float schemes: the parallel and the token-by-token pass differ only by float rounding
# amplified through re-quantization (4-bit and below: logit changes up to ~1, so near-tied argmaxes
# may flip either way; see greedy.py), so exact equality is asserted where that amplification is small
SCHEMES = ["bf16", "q8_0,window=4,sink=2", "k=int8:g8:chan:asym,v=int8:g8:asym,window=5", "fp8_e4m3"]


@pytest.mark.parametrize("name", SCHEMES)
def test_verified_greedy_equals_incremental(smollm2, name):
    model, tok = smollm2
    s, n = kvlab.scheme(name), model.config.n_layers
    prompt = text_tokens(tok, "pydoc")[300:360]
    want = _incremental(model, prompt, DecodeFaithfulBackend(s, n), 8)
    assert greedy_generate(model, prompt, DecodeFaithfulBackend(s, n), 8) == want
    # drafts rejected at every position exercise truncate + incremental continuation
    for k in (0, 3, 7):
        bad = want[:k] + [(want[k] + 1) % model.config.vocab_size] + want[k + 1:]
        b = DecodeFaithfulBackend(s, n)
        assert greedy_generate(model, prompt, b, 8, draft=bad) == want
        assert b.seq_len == prompt.numel() + 7           # prompt + every generated token but the last
    j = agreement(model, prompt, DecodeFaithfulBackend(s, n), 8)
    ref = reference_greedy(model, prompt, 8)
    assert want[:j] == ref[:j] and (j == 8 or want[j] != ref[j])


def test_verify_and_truncate_errors(smollm2):
    model, tok = smollm2
    b = DecodeFaithfulBackend(kvlab.scheme("q8_0"), model.config.n_layers)
    with pytest.raises(ValueError, match="draft"):
        verify(model, text_tokens(tok, "pydoc")[:8], [], b)
    model(text_tokens(tok, "pydoc")[:8][None], backend=b)
    with pytest.raises(ValueError, match="truncate 8 held tokens to 9"):
        b.truncate(9)
    with pytest.raises(ValueError, match="last=0"):
        model(text_tokens(tok, "pydoc")[:8][None], last=0)


def test_batched_agreements_equal_single(smollm2):
    from kvlab.eval.greedy import agreements
    model, tok = smollm2
    s, n = kvlab.scheme("int2:g32:asym"), model.config.n_layers
    text = text_tokens(tok, "pydoc")
    prompts = [text[i:i + 40] for i in (0, 500, 1000)]
    single = [agreement(model, p, DecodeFaithfulBackend(s, n), 6) for p in prompts]
    assert agreements(model, prompts, DecodeFaithfulBackend(s, n), 6) == single
    with pytest.raises(ValueError, match="one length"):
        agreements(model, [text[:4], text[:5]], DecodeFaithfulBackend(s, n), 6)


def test_batched_generation_equals_incremental(smollm2):
    """Batched verification; rows whose draft is rejected (forced here, at 0 and 3) continue alone."""
    from kvlab.eval.greedy import greedy_generate_batch, reference_greedy_batch
    from kvlab.model.llama import DenseCausalBackend
    model, tok = smollm2
    text = text_tokens(tok, "pydoc")
    prompts = [text[i:i + 48] for i in (100, 700, 1300)]
    ref = reference_greedy_batch(model, prompts, 6)
    assert ref == [_incremental(model, p, DenseCausalBackend(), 6) for p in prompts]
    for name in ("q8_0", "q4_0,window=4"):
        s, n = kvlab.scheme(name), model.config.n_layers
        want = [_incremental(model, p, DecodeFaithfulBackend(s, n), 6) for p in prompts]
        make = lambda: DecodeFaithfulBackend(s, n)  # noqa: E731
        assert greedy_generate_batch(model, prompts, make, 6) == want
        bad = [w[:k] + [(w[k] + 1) % 1000] + w[k + 1:] for w, k in zip(want, (0, 3, 5))]
        assert greedy_generate_batch(model, prompts, make, 6, drafts=bad) == want


@pytest.mark.parametrize("name", ["q8_0", "q4_0,window=6,sink=2", "k=int4:g8:chan:asym,v=int4:g8:asym,window=5"])
def test_score_bound_splits_queries_without_changing_results(monkeypatch, name):
    """faithful_attention splits its queries when scores would exceed MAX_SCORES: same output
    (attention level; through the model a 1e-7 change is amplified by re-quantization)."""
    import kvlab.eval.faithful as fa
    from kvlab.cache.window import FpPolicy
    s = kvlab.scheme(name)
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 8, 80, 64, generator=g), torch.randn(2, 2, 80, 64, generator=g), torch.randn(2, 2, 80, 64, generator=g)
    kq, vq = fa.quantized_history(k, s.k, s), fa.quantized_history(v, s.v, s)
    pos, pol = torch.arange(80), FpPolicy.of(s, 4)
    want = fa.faithful_attention(q, k, v, kq, vq, pos, pos, s.k, s.v, pol)
    for rows, chunk in ((3, 32), (7, 80)):  # sub-chunks of `rows` queries that do not divide the chunk
        for n_keys in (80, 160, 320):        # 1, 2 or 4 key blocks: n_keys decides the rows per call
            monkeypatch.setattr(fa, "MAX_SCORES", 2 * 8 * n_keys * rows)
            got = fa.faithful_attention(q, k, v, kq, vq, pos, pos, s.k, s.v, pol, q_chunk=chunk)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    step = torch.cat([fa.faithful_attention(q[:, :, t:t + 1], k[:, :, :t + 1], v[:, :, :t + 1], kq[:, :, :t + 1],
                                            vq[:, :, :t + 1], pos[t:t + 1], pos[:t + 1], s.k, s.v, pol)
                      for t in range(80)], dim=2)           # one query at a time (the decode-step path)
    torch.testing.assert_close(step, want, rtol=1e-5, atol=1e-5)


def test_zero_new_tokens(smollm2):
    from kvlab.eval.greedy import agreements, greedy_generate_batch, reference_greedy_batch
    model, tok = smollm2
    s, n = kvlab.scheme("q8_0"), model.config.n_layers
    p = text_tokens(tok, "pydoc")[:16]
    assert greedy_generate(model, p, DecodeFaithfulBackend(s, n), 0) == []
    assert greedy_generate_batch(model, [p, p], lambda: DecodeFaithfulBackend(s, n), 0) == [[], []]
    assert agreements(model, [p], DecodeFaithfulBackend(s, n), 0) == [0]
    assert reference_greedy_batch(model, [p], 0) == [[]]


def test_lockstep_continuation_equals_each_rows_own_decode(smollm2):
    """continue_batch: rows with 1, 3 and 5 known tokens decode together; each equals its own
    token-by-token decode with those tokens forced; bad input is rejected."""
    from kvlab.eval.greedy import continue_batch
    model, tok = smollm2
    text = text_tokens(tok, "pydoc")
    prompts = [text[i:i + 32] for i in (200, 900, 1600)]
    s, n = kvlab.scheme("q8_0"), model.config.n_layers
    known = [[11], [12, 13, 14], [15, 16, 17, 18, 19]]
    want = []
    for p, k in zip(prompts, known):  # fed as continue_batch feeds it: prompt + 1 token, then one at a time
        b = DecodeFaithfulBackend(s, n)
        lg = model(torch.cat([p, torch.tensor(k[:1])])[None], backend=b, last=1)
        gen = list(k[:1])
        while len(gen) < 7:
            gen.append(k[len(gen)] if len(gen) < len(k) else int(lg[0, -1].argmax()))
            lg = model(torch.tensor([[gen[-1]]]), backend=b, last=1)
        want.append(gen)
    assert continue_batch(model, DecodeFaithfulBackend(s, n), prompts, known, 7) == want
    with pytest.raises(ValueError, match="known tokens"):
        continue_batch(model, DecodeFaithfulBackend(s, n), prompts, [[], [1], [2]], 7)
    with pytest.raises(ValueError, match="one length"):
        continue_batch(model, DecodeFaithfulBackend(s, n), [text[:4], text[:5]], [[1], [2]], 7)
