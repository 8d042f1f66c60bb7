"""Load a local HF safetensors directory (Llama, Mistral, Qwen2) into HF-named tensors.

The directory holds `config.json` and `model.safetensors`, or shards listed in
`model.safetensors.index.json` (any `*.safetensors` otherwise). Names are already the ones
`LlamaModel.load_state_dict` takes, so no renaming and no RoPE permutation is needed.
Bad input (invalid config.json, truncated or corrupt weights, missing or misshapen tensors)
raises a ValueError that names the file and the problem.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from kvlab.model.config import LlamaConfig, require_supported
from kvlab.model.llama import LlamaModel

SUPPORTED_HF_ARCHS = ("llama", "mistral", "qwen2")


def _first(v: Any) -> Any:
    return v[0] if isinstance(v, list) and v else v


def config_from_hf(cfg: dict[str, Any]) -> LlamaConfig:
    """LlamaConfig from an HF `config.json` dict (transformers 4.x `rope_theta`/`rope_scaling`
    or 5.x `rope_parameters`). Raises ValueError for other model types or unsupported options."""
    mt = cfg.get("model_type")
    require_supported("model_type", mt, SUPPORTED_HF_ARCHS, " (config.json's model_type)")
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


def expected_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """HF name -> shape of every tensor `LlamaModel` needs for `config` (no lm_head when tied),
    e.g. `model.layers.0.self_attn.k_proj.weight` -> (n_kv_heads * head_dim, hidden_size)."""
    with torch.device("meta"):
        model = LlamaModel(config)
    return {(k if k.startswith("lm_head.") else f"model.{k}"): tuple(v.shape)
            for k, v in model.state_dict().items()
            if not (config.tie_word_embeddings and k.startswith("lm_head."))}


def check_shapes(found: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]]) -> None:
    """Raise ValueError listing the missing, unexpected and wrongly shaped tensors of `found`."""
    def few(names: list[str]) -> str:
        return ", ".join(names[:4]) + (f", ... ({len(names)} in all)" if len(names) > 4 else "")

    missing = [n for n in expected if n not in found]
    extra = [n for n in found if n not in expected]
    problems = [f"missing tensor(s) {few(missing)}"] if missing else []
    problems += [f"unexpected tensor(s) {few(extra)}"] if extra else []
    problems += [f"tensor {n} has shape {list(found[n])}, expected {list(s)}"
                 for n, s in expected.items() if n in found and tuple(found[n]) != s][:4]
    if problems:
        raise ValueError("; ".join(problems) + " (do the weights match the model config?)")


def _read_json(f: Path) -> dict[str, Any]:
    try:
        out = json.loads(f.read_text())
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"{str(f)!r} is not valid JSON: {e}") from e
    if not isinstance(out, dict):
        raise ValueError(f"{str(f)!r} holds a JSON {type(out).__name__}, expected an object")
    return out


def _read_config(f: Path) -> LlamaConfig:
    """LlamaConfig from a `config.json` file; ValueError naming the file if it is not valid
    JSON, lacks a key, or describes an unsupported model."""
    cfg = _read_json(f)
    try:
        return config_from_hf(cfg)
    except KeyError as e:
        raise ValueError(f"{str(f)!r} lacks the key {e.args[0]!r}") from e
    except (ValueError, TypeError, ZeroDivisionError) as e:
        raise ValueError(f"{str(f)!r}: {e}") from e


def safetensors_files(path: str | os.PathLike) -> list[Path]:
    """The weight files of an HF directory: index.json's shards, model.safetensors, or *.safetensors."""
    d = Path(path)
    index = d / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{str(index)!r} has no 'weight_map' object")
        files = [d / s for s in sorted(set(weight_map.values()))]
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


def _read_safetensors(f: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    out = {}
    try:
        with safe_open(str(f), framework="pt", device="cpu") as sf:
            for name in sf.keys():
                if not name.endswith("rotary_emb.inv_freq"):
                    out[name] = sf.get_tensor(name)
    except Exception as e:  # safetensors reports a cut or garbled file as SafetensorError
        raise ValueError(f"cannot read {str(f)!r} (truncated or corrupt .safetensors file?): {e}") from e
    for name, t in out.items():
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise ValueError(f"{str(f)!r}: tensor {name} holds NaN or Inf values (corrupt file?)")
        out[name] = t.to(dtype)
    return out


def load_hf_dir(path: str | os.PathLike,
                dtype: torch.dtype = torch.float32) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    """Read an HF directory. Returns (config, tensors): HF-named CPU tensors cast to `dtype`
    (e.g. `model.layers.0.self_attn.q_proj.weight` [n_heads * head_dim, hidden]).
    Raises FileNotFoundError (no directory / config.json / weights) or ValueError naming the
    file and the problem (invalid config.json, unsupported model, truncated or corrupt
    .safetensors, missing, unexpected or wrongly shaped tensors)."""
    d = Path(path).expanduser()
    if not d.is_dir():
        raise FileNotFoundError(f"HF model directory not found: {str(d)!r}")
    cfg_file = d / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{str(d)!r} has no config.json (expected an HF model directory)")
    config = _read_config(cfg_file)
    tensors: dict[str, torch.Tensor] = {}
    for f in safetensors_files(d):
        tensors.update(_read_safetensors(f, dtype))
    found = {n: tuple(t.shape) for n, t in tensors.items()
             if not (config.tie_word_embeddings and n == "lm_head.weight")}
    try:
        check_shapes(found, expected_shapes(config))
    except ValueError as e:
        raise ValueError(f"HF directory {str(d)!r}: {e}") from e
    return config, tensors
