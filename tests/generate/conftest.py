"""A tiny random Llama (2 layers, GQA 4/2, head_dim 64) for generation tests."""
import pytest
import torch


@pytest.fixture
def tiny_model():
    from kvlab.model import LlamaModel, config_from_hf
    cfg = {"model_type": "llama", "vocab_size": 64, "hidden_size": 128, "intermediate_size": 96,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
           "max_position_embeddings": 256, "rope_theta": 10000.0, "rms_norm_eps": 1e-6}
    torch.manual_seed(0)
    return LlamaModel(config_from_hf(cfg)).eval()
