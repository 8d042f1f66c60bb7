"""SmolLM2-135M-Instruct (GGUF) against transformers, incremental decode, capture, perplexity."""
from __future__ import annotations

import torch

from _model_testlib import needs_smollm2, rel_err

pytestmark = needs_smollm2
SAMPLE = ("The quick brown fox jumps over the lazy dog. In 1999, 12345 people said: it's "
          "<|im_start|>user\nWhy   spaces?\t Tabs, émigrés & naïve café — 3.14159!<|im_end|>")


def _ids(tok, n: int = 32) -> torch.Tensor:
    from kvlab.model import pydoc_topics_text, tokenize_text

    return tokenize_text(tok, pydoc_topics_text()[5000:], n)[None]  # [1, n]


def test_config(smollm2):
    c = smollm2[0].config
    assert (c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.hidden_size) == (30, 9, 3, 64, 576)
    assert c.rope_theta == 1e5 and c.tie_word_embeddings and c.vocab_size == 49152


def test_logits_match_transformers(smollm2, transformers):
    """Independent check of the GGUF conversion (q/k un-permute) and the forward: <= 1e-4."""
    from kvlab.model import smollm2_gguf_path

    model, tok = smollm2
    p = smollm2_gguf_path()
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name,
                                                            dtype=torch.float32).eval()
    ids = _ids(tok, 32)
    with torch.inference_mode():
        ours, theirs = model(ids), ref(ids).logits.float()
    assert ours.dtype == torch.float32 and ours.shape == (1, 32, 49152)
    err = rel_err(ours, theirs)
    print(f"SmolLM2 logits rel err vs transformers: {err:.3e}")
    assert err <= 1e-4


def test_tokenizer_matches_transformers(smollm2, transformers):
    from kvlab.model import smollm2_gguf_path, pydoc_topics_text

    p = smollm2_gguf_path()
    ref = transformers.AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
    tok = smollm2[1]
    for text in (SAMPLE, pydoc_topics_text()[:20000]):
        ours = tok.encode(text, add_special_tokens=False).ids
        assert ours == ref(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(tok.encode(SAMPLE, add_special_tokens=False).ids, skip_special_tokens=False) == SAMPLE


def test_tokenizer_special_tokens_and_digits(smollm2):
    tok = smollm2[1]
    ids = tok.encode("<|im_start|>assistant 2024<|im_end|>", add_special_tokens=False).ids
    assert ids[0] == 1 and ids[-1] == 2  # control tokens stay whole
    assert [tok.id_to_token(i) for i in ids[-5:-1]] == ["2", "0", "2", "4"]  # digits one by one


def test_incremental_decode_equals_full_forward(smollm2):
    from kvlab.model import DenseCausalBackend

    model, tok = smollm2
    ids = _ids(tok, 24)
    with torch.inference_mode():
        full = model(ids)
        be = DenseCausalBackend()
        steps = [model(ids[:, :16], backend=be)]  # prefill
        for t in range(16, 20):  # one token at a time, positions implied by the backend
            steps.append(model(ids[:, t:t + 1], backend=be))
        steps.append(model(ids[:, 20:24], positions=torch.arange(20, 24), backend=be))  # chunk
    assert be.seq_len == 24
    assert rel_err(torch.cat(steps, dim=1), full) < 1e-5


def test_batch_equals_single(smollm2):
    model, tok = smollm2
    ids = torch.cat([_ids(tok, 12), _ids(tok, 40)[:, 28:]], dim=0)  # [2, 12]
    with torch.inference_mode():
        both = model(ids)
        one = torch.cat([model(ids[:1]), model(ids[1:])], dim=0)
    assert rel_err(both, one) < 1e-5


def test_capture(smollm2):
    model, tok = smollm2
    ids = _ids(tok, 10)
    out = model.capture(ids, hidden_states=True)
    c = model.config
    assert len(out["q"]) == len(out["k"]) == len(out["k_pre"]) == len(out["v"]) == c.n_layers
    assert out["q"][0].shape == (1, c.n_heads, 10, c.head_dim)
    assert out["k_pre"][3].shape == out["v"][3].shape == (1, c.n_kv_heads, 10, c.head_dim)
    assert all(t.dtype == torch.float32 for t in out["q"] + out["k"] + out["v"])
    pos = torch.arange(10)
    torch.testing.assert_close(model.apply_rope(out["k_pre"][5], pos), out["k"][5])
    assert len(out["hidden_states"]) == c.n_layers + 1
    with torch.inference_mode():
        assert rel_err(out["logits"], model(ids)) < 1e-6


def test_load_model_is_cached(smollm2):
    from kvlab.model import load_model

    assert load_model("smollm2") is smollm2
    assert load_model("SmolLM2") is smollm2


def test_perplexity_pydoc_topics(smollm2):
    """DESIGN.md section 5: first 2,048 tokens of the pydoc topics, no BOS, fp32 -> PPL ~11.95."""
    from kvlab.model import pydoc_topics_text, tokenize_text

    model, tok = smollm2
    ids = tokenize_text(tok, pydoc_topics_text(), 2048)
    with torch.inference_mode():
        logits = model(ids[None])[0]  # [2048, V]
    ppl = torch.nn.functional.cross_entropy(logits[:-1], ids[1:]).exp().item()
    print(f"SmolLM2 PPL pydoc topics 2048 tokens: {ppl:.4f}")
    assert 11.5 <= ppl <= 12.5
