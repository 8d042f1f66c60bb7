"""Test-wide setup: Triton's CPU interpreter when there is no GPU; deterministic hypothesis in CI."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must be set before triton is imported

from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture
def tiny_llama():
    """Factory of a tiny random Llama (2 layers, hidden 128, head_dim 64, vocab 64, seeded):
    tiny_llama(heads=4, kv_heads=2, max_pos=256) -> LlamaModel in eval mode."""
    def make(heads: int = 4, kv_heads: int = 2, max_pos: int = 256):
        from kvlab.model import LlamaModel, config_from_hf
        cfg = {"model_type": "llama", "vocab_size": 64, "hidden_size": 128, "intermediate_size": 96,
               "num_hidden_layers": 2, "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": 64,
               "max_position_embeddings": max_pos, "rope_theta": 10000.0, "rms_norm_eps": 1e-6}
        torch.manual_seed(0)
        return LlamaModel(config_from_hf(cfg)).eval()
    return make
