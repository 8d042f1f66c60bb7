"""Load a local HF safetensors directory (Llama, Mistral, Qwen2) into HF-named tensors.

The directory holds `config.json` and `model.safetensors`, or shards listed in
`model.safetensors.index.json` (any `*.safetensors` otherwise). Names are already the ones
`LlamaModel.load_state_dict` takes, so no renaming and no RoPE permutation is needed.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from kvlab.model.config import LlamaConfig

SUPPORTED_HF_ARCHS = ("llama", "mistral", "qwen2")


def _first(v: Any) -> Any:
    return v[0] if isinstance(v, list) and v else v


def config_from_hf(cfg: dict[str, Any]) -> LlamaConfig:
    """LlamaConfig from an HF `config.json` dict (transformers 4.x `rope_theta`/`rope_scaling`
    or 5.x `rope_parameters`). Raises ValueError for other model types or unsupported options."""
    mt = cfg.get("model_type")
    if mt not in SUPPORTED_HF_ARCHS:
        raise ValueError(f"unsupported model_type {mt!r} in config.json; supported: "
                         f"{', '.join(SUPPORTED_HF_ARCHS)}")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {cfg['hidden_act']!r} is not supported (only 'silu')")
    if cfg.get("mlp_bias"):
        raise ValueError("mlp_bias=True is not supported")
    rp = cfg.get("rope_parameters") or {}
    if rp and "rope_type" not in rp and "rope_theta" not in rp:
        raise ValueError(f"per-layer-type rope_parameters are not supported: {list(rp)}")
    theta = cfg.get("rope_theta", rp.get("rope_theta", 10000.0))
    scaling = cfg.get("rope_scaling") or {k: v for k, v in rp.items() if k != "rope_theta"}
    if scaling.get("rope_type", scaling.get("type", "default")) == "default":
        scaling = None
    n_heads = cfg["num_attention_heads"]
    if mt == "qwen2":
        bias, o_bias = True, False  # Qwen2: q/k/v biases, none on o_proj
        window = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
        if window is not None:
            raise ValueError("Qwen2 use_sliding_window=True (window on some layers) is not supported")
    else:
        bias = o_bias = bool(cfg.get("attention_bias", False))  # HF Llama: all four projections
        window = cfg.get("sliding_window") if mt == "mistral" else None
    return LlamaConfig(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"], n_layers=cfg["num_hidden_layers"],
        n_heads=n_heads, n_kv_heads=cfg.get("num_key_value_heads") or n_heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // n_heads,
        rope_theta=float(theta), rope_scaling=scaling, rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        bos_token_id=_first(cfg.get("bos_token_id")), eos_token_id=_first(cfg.get("eos_token_id")),
        attention_bias=bias, o_proj_bias=o_bias, sliding_window=window, arch=mt,
    )


def safetensors_files(path: str | os.PathLike) -> list[Path]:
    """The weight files of an HF directory: index.json's shards, model.safetensors, or *.safetensors."""
    d = Path(path)
    index = d / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [d / s for s in shards]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"shards listed in {index} are missing: {missing}")
        return files
    if (d / "model.safetensors").is_file():
        return [d / "model.safetensors"]
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {str(d)!r} (PyTorch .bin checkpoints "
                                "are not supported; re-save with safe_serialization=True)")
    return files


def load_hf_dir(path: str | os.PathLike,
                dtype: torch.dtype = torch.float32) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    """Read an HF directory. Returns (config, tensors): HF-named CPU tensors cast to `dtype`
    (e.g. `model.layers.0.self_attn.q_proj.weight` [n_heads * head_dim, hidden]).
    Raises FileNotFoundError (no directory / config.json / weights) or ValueError."""
    from safetensors import safe_open

    d = Path(path).expanduser()
    if not d.is_dir():
        raise FileNotFoundError(f"HF model directory not found: {str(d)!r}")
    cfg_file = d / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{str(d)!r} has no config.json (expected an HF model directory)")
    config = config_from_hf(json.loads(cfg_file.read_text()))
    tensors: dict[str, torch.Tensor] = {}
    for f in safetensors_files(d):
        with safe_open(str(f), framework="pt", device="cpu") as sf:
            for name in sf.keys():
                if name.endswith("rotary_emb.inv_freq"):
                    continue
                tensors[name] = sf.get_tensor(name).to(dtype)
    if "model.embed_tokens.weight" not in tensors:
        raise ValueError(f"{str(d)!r}: no model.embed_tokens.weight among the weights")
    if not config.tie_word_embeddings and "lm_head.weight" not in tensors:
        raise ValueError(f"{str(d)!r}: tie_word_embeddings is false but lm_head.weight is missing")
    return config, tensors
