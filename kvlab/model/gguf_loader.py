"""Load a Llama-architecture (or Qwen2) GGUF file into HF-named float32 tensors.

Tensors are dequantized with `gguf.quants.dequantize` (Q4_1, Q8_0, F16, F32, ... anything the
`gguf` package knows). llama.cpp's converter stores the rows of `attn_q`/`attn_k` of the "llama"
architecture permuted for its interleaved (GPT-J style) RoPE; we undo that permutation so the
model can use HF's rotate-half RoPE. Results are cached in-process per (path, size, mtime) and
on disk as a safetensors file under `$KVLAB_CACHE_DIR` (default `~/.cache/kvlab`) / `gguf/`, keyed
by the file's content; only the few most recently used conversions are kept there.

A truncated or corrupt file, an unsupported architecture, missing metadata or missing, extra or
misshapen tensors raise a ValueError naming the file and the problem, before anything is cached.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kvlab.model.config import Gemma3Config, LlamaConfig, gemma3_layer_types, require_supported
from kvlab.model.gemma3 import Gemma3Model
from kvlab.model.hf_loader import check_shapes, expected_shapes

SUPPORTED_GGUF_ARCHS = ("llama", "qwen2")
GEMMA3_GGUF_ARCHS = ("gemma3",)  # loaded into Gemma3Model (see `gemma3_config_from_gguf`)
_CACHE_VERSION = 2  # bump when the conversion changes, so stale disk caches are ignored (2: checked)
_TOKENIZER_KEYS = ("model", "pre", "tokens", "merges", "token_type", "bos_token_id",
                   "eos_token_id", "unknown_token_id", "padding_token_id", "add_bos_token",
                   "add_eos_token", "add_space_prefix")
_NAME_MAP = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}  # GGUF -> HF names outside the layers
_MEM_CACHE: dict[tuple, GGUFWeights] = {}


@dataclass
class GGUFWeights:
    """A GGUF file converted for `LlamaModel`.

    tensors: HF-named float32 CPU tensors (`model.layers.0.self_attn.q_proj.weight` [out, in]).
    tokenizer: the `tokenizer.ggml.*` fields without the prefix (tokens, merges, model, pre, ...).
    rope_freq_factors: float32 [head_dim // 2] from `rope_freqs.weight`, or None.
    """

    config: LlamaConfig | Gemma3Config
    tensors: dict[str, torch.Tensor]
    tokenizer: dict[str, Any] = field(default_factory=dict)
    rope_freq_factors: torch.Tensor | None = None


def gguf_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert.py's permute of q/k rows (HF rotate-half -> interleaved RoPE).
    w: [n_head * head_dim, ...] (weight or bias). Returns the same shape."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def undo_gguf_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of `gguf_permute`: rows stored for interleaved RoPE -> HF rotate-half order.
    w: [n_head * head_dim, ...]. Returns the same shape."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def check_gguf_file(path: str | os.PathLike) -> Path:
    """Return the path if it is an existing GGUF file; raise FileNotFoundError / ValueError."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"GGUF file not found: {str(p)!r}")
    with open(p, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ValueError(f"{str(p)!r} is not a GGUF file (magic {magic!r}, expected b'GGUF'); "
                         "pass a .gguf file, an HF model directory, or 'smollm2'")
    return p


def load_gguf(path: str | os.PathLike, disk_cache: bool = True) -> GGUFWeights:
    """Read, dequantize and convert a GGUF file (cached in-process and, if disk_cache, on disk).

    Raises FileNotFoundError for a missing file; ValueError naming the file for a non-GGUF,
    truncated or corrupt file, an architecture other than SUPPORTED_GGUF_ARCHS, missing
    metadata, or missing, extra or misshapen tensors.
    """
    p = check_gguf_file(path)
    st = p.stat()
    mem_key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    if mem_key in _MEM_CACHE:
        return _MEM_CACHE[mem_key]
    cache_base = _disk_cache_base(p, st) if disk_cache else None
    w = _read_disk_cache(cache_base) if cache_base is not None else None
    if w is None:
        w = _convert(p)
        if cache_base is not None:
            _write_disk_cache(cache_base, w)
    _MEM_CACHE[mem_key] = w
    return w


def _field_values(reader) -> dict[str, Any]:
    out = {}
    for name, f in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        v = f.contents()
        out[name] = v.item() if isinstance(v, np.generic) else v
    return out


def config_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> LlamaConfig:
    """Build a LlamaConfig from GGUF metadata (`{arch}.*` keys) and the tensors present
    (`shapes`: GGUF name -> shape in torch order, e.g. token_embd.weight -> (vocab, hidden))."""
    arch = meta.get("general.architecture")
    require_supported("GGUF architecture", arch, SUPPORTED_GGUF_ARCHS, " (Llama/Mistral GGUFs use 'llama')")

    def get(key: str, default: Any = None) -> Any:
        v = meta.get(f"{arch}.{key}", default)
        if v is None:
            raise ValueError(f"metadata lacks the key {arch}.{key}")
        if isinstance(v, list):
            raise ValueError(f"GGUF metadata {arch}.{key} varies per layer ({v[:4]}...): not supported")
        return v

    hidden, n_heads = int(get("embedding_length")), int(get("attention.head_count"))
    if "token_embd.weight" not in shapes:
        raise ValueError("missing tensor token_embd.weight")
    vocab = meta.get(f"{arch}.vocab_size") or shapes["token_embd.weight"][0]
    rope_scaling = None
    kind = meta.get(f"{arch}.rope.scaling.type")
    if kind == "linear":
        rope_scaling = {"rope_type": "linear", "factor": float(get("rope.scaling.factor"))}
    elif kind not in (None, "none"):
        raise ValueError(f"unsupported GGUF rope scaling {kind!r}; supported: none, linear "
                         "(llama3-style scaling comes as a rope_freqs tensor)")
    return LlamaConfig(
        vocab_size=int(vocab),
        hidden_size=hidden, intermediate_size=int(get("feed_forward_length")),
        n_layers=int(get("block_count")), n_heads=n_heads,
        n_kv_heads=int(get("attention.head_count_kv", n_heads)),
        head_dim=int(get("attention.key_length", hidden // n_heads)),
        rope_theta=float(get("rope.freq_base", 10000.0)), rope_scaling=rope_scaling,
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        max_position_embeddings=int(get("context_length", 2048)),
        tie_word_embeddings="output.weight" not in shapes,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        attention_bias="blk.0.attn_q.bias" in shapes, o_proj_bias="blk.0.attn_output.bias" in shapes,
        arch=arch,
    )


def hf_name(gguf_name: str, name_map: dict | None = None) -> str | None:
    """GGUF tensor name -> HF name (None for tensors the model does not use); name_map: the per-layer names of
    the architecture (default: Llama's)."""
    name_map = _NAME_MAP if name_map is None else name_map
    if gguf_name in _TOP_NAMES:
        return _TOP_NAMES[gguf_name]
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", gguf_name)
    if m and m.group(2) in name_map:
        return f"model.layers.{m.group(1)}.{name_map[m.group(2)]}.{m.group(3)}"
    return None


def _gguf_name(name: str) -> str:
    """HF tensor name -> GGUF name (inverse of `hf_name` for the tensors the model uses)."""
    top = {h: g for g, h in _TOP_NAMES.items()}
    if name in top:
        return top[name]
    layer, rest = name.removeprefix("model.layers.").split(".", 1)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{ {h: g for g, h in _NAME_MAP.items()}[module] }.{kind}"


def _check_gguf_shapes(config: LlamaConfig, shapes: dict[str, tuple[int, ...]]) -> None:
    """ValueError unless the tensors the model uses (`shapes`: GGUF name -> torch-order shape)
    are exactly those `config` needs, with their shapes (rope_freqs: [head_dim // 2])."""
    expected = {_gguf_name(n): s for n, s in expected_shapes(config).items()}
    if "rope_freqs.weight" in shapes:
        expected["rope_freqs.weight"] = (config.head_dim // 2,)
    check_shapes({n: s for n, s in shapes.items() if hf_name(n) or n == "rope_freqs.weight"}, expected)


def _checked_reader(p: Path):
    """A `gguf.GGUFReader` for `p` that raises ValueError naming the part being read (header,
    metadata, tensor info, the data of one tensor) when a read would run past the end of the
    file; the stock reader then silently returns short arrays and fails later inside numpy."""
    import gguf  # imported here: reading the package is only needed on a cache miss

    class Reader(gguf.GGUFReader):
        part = "the header"
        data_of: dict[int, str] = {}  # file offset -> "the data of tensor X"

        def _get(self, offset, dtype, count=1, override_order=None):
            end = int(offset) + np.dtype(dtype).itemsize * int(count)
            if end > len(self.data):
                where = self.data_of.get(int(offset), self.part)
                raise ValueError(f"{where} needs bytes {int(offset)}..{end} but the file ends at byte "
                                 f"{len(self.data)}")
            return super()._get(offset, dtype, count, override_order)

        def _build_fields(self, offs, count):
            self.part = "the metadata (key/value pairs)"
            return super()._build_fields(offs, count)

        def _build_tensor_info(self, offs, count):
            self.part = "the tensor info"
            return super()._build_tensor_info(offs, count)

        def _build_tensors(self, start_offs, fields):
            self.part = "the tensor data"
            self.data_of = {int(start_offs) + int(f.parts[-1][0]): f"the data of tensor {f.name}"
                            for f in fields}
            return super()._build_tensors(start_offs, fields)

    return Reader(str(p), "r")


def _convert(p: Path) -> GGUFWeights:
    """Read and convert `p`; every problem becomes a ValueError that names the file."""
    try:
        reader = _checked_reader(p)
        meta = _field_values(reader)
    except Exception as e:  # the gguf package reports a garbled file in many ways
        raise ValueError(f"cannot read GGUF file {str(p)!r} (truncated or corrupt?): {e}") from e
    try:
        return _convert_tensors(reader, meta)
    except (ValueError, TypeError, ZeroDivisionError) as e:  # bad metadata values, missing tensors
        raise ValueError(f"GGUF file {str(p)!r}: {e}") from e


def _dequantize(t, shape: tuple[int, ...]) -> np.ndarray:
    """One GGUF tensor as float32 numpy in torch order `shape`; ValueError for an unknown type or NaN/Inf."""
    import gguf

    # np.asarray drops the memmap subclass, whose per-view bookkeeping dominates dequantize
    try:
        arr = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
    except NotImplementedError as e:
        raise ValueError(f"tensor {t.name} has type {t.tensor_type.name}, which the gguf "
                         f"package cannot dequantize ({e})") from e
    arr = np.ascontiguousarray(arr, dtype=np.float32).reshape(shape)
    if not np.isfinite(arr).all():
        raise ValueError(f"tensor {t.name} holds NaN or Inf values (corrupt data?)")
    return arr


def _convert_tensors(reader, meta: dict[str, Any]) -> GGUFWeights:
    shapes = {t.name: tuple(int(d) for d in reversed(t.shape)) for t in reader.tensors}
    if meta.get("general.architecture") in GEMMA3_GGUF_ARCHS:
        return _convert_gemma3(reader, meta, shapes)
    config = config_from_gguf(meta, shapes)
    _check_gguf_shapes(config, shapes)
    tensors: dict[str, torch.Tensor] = {}
    factors = None
    for t in reader.tensors:
        arr = _dequantize(t, shapes[t.name])
        if t.name == "rope_freqs.weight":
            factors = torch.from_numpy(arr.copy())
            continue
        name = hf_name(t.name)
        if name is None:
            continue
        if config.arch == "llama" and ".attn_q." in t.name:
            arr = undo_gguf_permute(arr, config.n_heads)
        elif config.arch == "llama" and ".attn_k." in t.name:
            arr = undo_gguf_permute(arr, config.n_kv_heads)
        if not (arr.flags.writeable and arr.flags.c_contiguous):  # F32 tensors view the file
            arr = np.array(arr, dtype=np.float32, order="C")
        tensors[name] = torch.from_numpy(arr)
    tok = {k[len("tokenizer.ggml."):]: v for k, v in meta.items() if k.startswith("tokenizer.ggml.")}
    tok = {k: v for k, v in tok.items() if k in _TOKENIZER_KEYS}
    return GGUFWeights(config, tensors, tok, factors)


# ---- Gemma 3 ----------------------------------------------------------------------------------
_GEMMA3_NAME_MAP = {
    "attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
# llama.cpp hard-codes these for LLM_ARCH_GEMMA3 (src/llama-model.cpp: set_swa_pattern(6),
# rope_freq_base_train_swa = 10000); newer files may state them, and then we read them.
GEMMA3_DEFAULT_SWA_PATTERN = 6
GEMMA3_DEFAULT_LOCAL_ROPE_BASE = 10_000.0


def gemma3_hf_name(gguf_name: str) -> str | None:
    """Gemma 3 GGUF tensor name -> HF name (None for tensors the model does not use)."""
    return hf_name(gguf_name, _GEMMA3_NAME_MAP)


def gemma3_layer_types_from_meta(meta: dict[str, Any], n_layers: int) -> tuple[str, ...]:
    """Layer types from `gemma3.attention.sliding_window_pattern`: an int period (every period-th layer is
    global), or one bool per layer (True: sliding); absent: llama.cpp's period of 6."""
    pat = meta.get("gemma3.attention.sliding_window_pattern", GEMMA3_DEFAULT_SWA_PATTERN)
    if isinstance(pat, (list, tuple, np.ndarray)):
        if len(pat) != n_layers:
            raise ValueError(f"gemma3.attention.sliding_window_pattern has {len(pat)} entries for {n_layers} layers")
        return tuple("sliding_attention" if bool(s) else "full_attention" for s in pat)
    if isinstance(pat, bool) or not isinstance(pat, (int, np.integer)) or pat <= 0:
        raise ValueError(f"gemma3.attention.sliding_window_pattern must be a positive int or a list of bools, "
                         f"got {pat!r}")
    return gemma3_layer_types(n_layers, int(pat))


def gemma3_config_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> Gemma3Config:
    """A Gemma3Config from a gemma3 GGUF's metadata and tensor shapes (torch order).

    Not in the metadata of llama.cpp's files and taken as llama.cpp does: the layer pattern (every 6th
    layer global), the local RoPE base (10000), query_pre_attn_scalar (head_dim; hidden / heads for the
    62-layer 27B). Attention-logit soft-capping is rejected (Gemma 3 has none; backends cannot apply it)."""
    arch = meta.get("general.architecture")
    require_supported("GGUF architecture", arch, GEMMA3_GGUF_ARCHS)

    def get(key: str, default: Any = None) -> Any:
        v = meta.get(f"{arch}.{key}", default)
        if v is None:
            raise ValueError(f"metadata lacks the key {arch}.{key}")
        if isinstance(v, list):
            raise ValueError(f"GGUF metadata {arch}.{key} varies per layer ({v[:4]}...): not supported")
        return v

    if "token_embd.weight" not in shapes:
        raise ValueError("missing tensor token_embd.weight")
    hidden, n_heads, n_layers = int(get("embedding_length")), int(get("attention.head_count")), int(get("block_count"))
    head_dim = int(get("attention.key_length", hidden // n_heads))
    if int(get("attention.value_length", head_dim)) != head_dim:
        raise ValueError(f"{arch}.attention.value_length {get('attention.value_length')} != key_length {head_dim}")
    if meta.get(f"{arch}.attn_logit_softcapping"):
        raise ValueError(f"{arch}.attn_logit_softcapping is set: attention-logit soft-capping is not supported")
    rope_scaling = None
    kind = meta.get(f"{arch}.rope.scaling.type")
    if kind == "linear":
        rope_scaling = {"rope_type": "linear", "factor": float(get("rope.scaling.factor"))}
    elif kind not in (None, "none"):
        raise ValueError(f"unsupported GGUF rope scaling {kind!r}; supported: none, linear")
    cap = meta.get(f"{arch}.final_logit_softcapping")
    return Gemma3Config(
        vocab_size=int(meta.get(f"{arch}.vocab_size") or shapes["token_embd.weight"][0]),
        hidden_size=hidden, intermediate_size=int(get("feed_forward_length")), n_layers=n_layers,
        n_heads=n_heads, n_kv_heads=int(get("attention.head_count_kv", n_heads)), head_dim=head_dim,
        layer_types=gemma3_layer_types_from_meta(meta, n_layers),
        sliding_window=int(get("attention.sliding_window")),
        rope_theta=float(get("rope.freq_base", 1_000_000.0)),
        rope_local_theta=float(get("rope.freq_base_swa", GEMMA3_DEFAULT_LOCAL_ROPE_BASE)),
        rope_scaling=rope_scaling, rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        max_position_embeddings=int(get("context_length", 32768)),
        query_pre_attn_scalar=float(hidden // n_heads if n_layers == 62 else head_dim),
        final_logit_softcapping=float(cap) if cap else None,
        tie_word_embeddings="output.weight" not in shapes,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"), eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
    )


def _convert_gemma3(reader, meta: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> GGUFWeights:
    """Gemma 3: no q/k row permutation (llama.cpp runs Gemma with NEOX-style RoPE, HF's rotate-half), and
    every `*norm.weight` is stored with Gemma's + 1 folded in (convert_hf_to_gguf.py's norm_shift), which
    we take back out to keep HF's convention."""
    config = gemma3_config_from_gguf(meta, shapes)
    expected = Gemma3Model.expected_shapes(config)
    check_shapes({gemma3_hf_name(n): s for n, s in shapes.items() if gemma3_hf_name(n)}, expected)
    tensors: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        name = gemma3_hf_name(t.name)
        if name is None:
            continue
        arr = _dequantize(t, shapes[t.name])
        if t.name.endswith("norm.weight"):
            arr = arr - np.float32(1.0)
        elif not (arr.flags.writeable and arr.flags.c_contiguous):  # F32 tensors view the file
            arr = np.array(arr, dtype=np.float32, order="C")
        tensors[name] = torch.from_numpy(arr)
    tok = {k[len("tokenizer.ggml."):]: v for k, v in meta.items() if k.startswith("tokenizer.ggml.")}
    tok = {k: v for k, v in tok.items() if k in _TOKENIZER_KEYS}
    return GGUFWeights(config, tensors, tok, None)


def cache_dir() -> Path:
    """Root of kvlab's on-disk caches: $KVLAB_CACHE_DIR or ~/.cache/kvlab."""
    return Path(os.environ.get("KVLAB_CACHE_DIR", "~/.cache/kvlab")).expanduser()


def _disk_cache_base(p: Path, st: os.stat_result) -> Path:
    """Cache key: the SHA-1 of the whole file (~0.4 s for 100 MB; path and mtime independent).

    mtime is deliberately not part of the key: every fresh `pip install` of the model package
    gives the same bytes a new mtime, and keying on it grew one 0.5 GB entry per venv."""
    h = hashlib.sha1(f"v{_CACHE_VERSION}:{st.st_size}".encode())
    with open(p, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return cache_dir() / "gguf" / f"{p.stem}-{h.hexdigest()[:16]}"


_CACHE_KEEP = 3  # converted models kept on disk; the least recently used beyond this are removed


def _prune_disk_cache(folder: Path, keep: int = _CACHE_KEEP) -> None:
    """Remove all but the `keep` most recently used complete entries (and stale temp files)."""
    try:
        entries = sorted(folder.glob("*.json"), key=lambda j: j.stat().st_mtime, reverse=True)
        for js in entries[keep:]:
            base = js.parent / js.name[: -len(".json")]
            for f in (js, _sibling(base, ".safetensors")):
                f.unlink(missing_ok=True)
        live = {j.name[: -len(".json")] for j in entries[:keep]}
        # orphans of a writer killed before its JSON landed; an hour's grace for writers still running
        for f in [*folder.glob("*.safetensors"), *folder.glob("*.tmp*")]:
            stem = f.name.split(".tmp")[0].removesuffix(".safetensors").removesuffix(".json")
            if stem not in live and time.time() - f.stat().st_mtime > 3600:
                f.unlink(missing_ok=True)
    except OSError:
        pass


def _sibling(base: Path, suffix: str) -> Path:
    return base.parent / (base.name + suffix)  # not with_suffix: stems contain dots (".Q4_1")


def _read_disk_cache(base: Path) -> GGUFWeights | None:
    from safetensors.torch import load_file

    js, sf = _sibling(base, ".json"), _sibling(base, ".safetensors")
    if not (js.is_file() and sf.is_file()):
        return None
    try:
        info = json.loads(js.read_text())
        tensors = load_file(str(sf))
        factors = tensors.pop("rope_freqs", None)
        gemma = info["config"].get("arch") in GEMMA3_GGUF_ARCHS
        config = (Gemma3Config if gemma else LlamaConfig).from_dict(info["config"])
        w = GGUFWeights(config, tensors, dict(info["tokenizer"]), factors)
        check_shapes({n: tuple(t.shape) for n, t in tensors.items()},
                     Gemma3Model.expected_shapes(config) if gemma else expected_shapes(config))
        os.utime(js)  # marks the entry as recently used for _prune_disk_cache
    except Exception:  # a damaged or incomplete cache entry is rebuilt, never fatal
        return None
    return w


def _write_disk_cache(base: Path, w: GGUFWeights) -> None:
    from safetensors.torch import save_file

    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        tensors = dict(w.tensors)
        if w.rope_freq_factors is not None:
            tensors["rope_freqs"] = w.rope_freq_factors
        tmp = f".tmp{os.getpid()}"
        sf, js = _sibling(base, ".safetensors"), _sibling(base, ".json")
        save_file(tensors, str(sf) + tmp)
        os.replace(str(sf) + tmp, sf)
        # the JSON is written last: its presence marks a complete cache entry
        Path(str(js) + tmp).write_text(json.dumps({"config": w.config.to_dict(), "tokenizer": w.tokenizer}))
        os.replace(str(js) + tmp, js)
        _prune_disk_cache(base.parent)
    except OSError:  # a read-only or full disk only costs speed
        pass
