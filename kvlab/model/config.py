"""Model configuration for the Llama-family reference decoder (Llama, Mistral, Qwen2).

`LlamaConfig` is the one normalised form the loaders produce (from GGUF metadata or an HF
`config.json`) and the model consumes. RoPE frequencies, including HF's "linear" and "llama3"
rope scaling, are computed here so that every caller rotates keys the same way.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

SUPPORTED_ROPE_SCALING = ("linear", "llama3")


@dataclass(frozen=True)
class LlamaConfig:
    """Shape and hyper-parameters of a Llama-family decoder.

    rope_scaling: None, or a dict like HF's: {"rope_type": "linear", "factor": 4.0} or
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192}. The key "type" is accepted for "rope_type".
    attention_bias: q/k/v projections carry a bias (Qwen2; Llama with attention_bias).
    o_proj_bias: the output projection carries a bias (Llama with attention_bias, not Qwen2).
    sliding_window: None, or the attention window of every layer (Mistral v0.1): query i
    sees keys j with i - window < j <= i.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    attention_bias: bool = False
    o_proj_bias: bool = False
    sliding_window: int | None = None
    arch: str = "llama"  # llama, mistral or qwen2: llama.cpp's converter permutes q/k rows of the first two

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "n_layers", "n_heads",
                     "n_kv_heads", "head_dim"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"LlamaConfig.{name} must be a positive int, got {v!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads "
                             f"({self.n_kv_heads}) for grouped-query attention")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.rope_scaling is not None:
            kind = rope_scaling_type(self.rope_scaling)
            if kind not in SUPPORTED_ROPE_SCALING and kind != "default":
                raise ValueError(f"unsupported rope_scaling type {kind!r}; supported: "
                                 f"None, 'default', {', '.join(map(repr, SUPPORTED_ROPE_SCALING))}")

    @property
    def gguf_qk_permuted(self) -> bool:
        """llama.cpp's converter stores this model's q/k rows permuted for its interleaved RoPE (llama-arch
        models, Mistral included; not Qwen2), so llama.cpp's K cache holds channels in that order."""
        return self.arch in ("llama", "mistral")

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA ratio)."""
        return self.n_heads // self.n_kv_heads

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict; `LlamaConfig.from_dict(c.to_dict()) == c`."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LlamaConfig":
        """Inverse of `to_dict` (unknown keys are rejected)."""
        return cls(**d)


def rope_scaling_type(rope_scaling: dict[str, Any] | None) -> str:
    """The scaling kind of an HF-style rope_scaling dict ("default" when None)."""
    if not rope_scaling:
        return "default"
    return str(rope_scaling.get("rope_type", rope_scaling.get("type", "default")))


def rope_inv_freq(config: LlamaConfig) -> torch.Tensor:
    """Inverse RoPE frequencies, float32 [head_dim // 2], exactly as HF transformers computes
    them (default, "linear" and "llama3" rope types; attention scaling is 1 for all three).
    Always on CPU (also inside a `torch.device("meta")` context); move it where needed."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim))
    kind = rope_scaling_type(config.rope_scaling)
    rs = config.rope_scaling or {}
    if kind == "linear":
        return inv_freq / float(rs["factor"])
    if kind == "llama3":
        factor = float(rs["factor"])
        low = float(rs.get("low_freq_factor", 1.0))
        high = float(rs.get("high_freq_factor", 4.0))
        old_ctx = float(rs.get("original_max_position_embeddings", 8192))
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv_freq
        # long wavelengths (low frequencies) are slowed by `factor`; short ones kept; a smooth
        # interpolation in between (HF `_compute_llama3_parameters`).
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(is_medium, smoothed, scaled)
    return inv_freq


def require_supported(what: str, value, allowed, hint: str = "") -> None:
    """ValueError `unsupported {what} {value!r}; supported: ...` unless value is one of `allowed`."""
    if value not in allowed:
        raise ValueError(f"unsupported {what} {value!r}; supported: {', '.join(allowed)}{hint}")


GEMMA3_LAYER_TYPES = ("sliding_attention", "full_attention")


def gemma3_layer_types(n_layers: int, pattern: int) -> tuple[str, ...]:
    """Gemma 3's layer pattern: every `pattern`-th layer (1-based) is global ("full_attention"), the
    others slide ("sliding_attention"). HF Gemma3TextConfig's default and llama.cpp's
    `set_swa_pattern(6)` (src/llama-model.cpp, LLM_ARCH_GEMMA3) agree on this rule."""
    if not isinstance(pattern, int) or pattern <= 0:
        raise ValueError(f"sliding window pattern must be a positive int, got {pattern!r}")
    return tuple("full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n_layers))


@dataclass(frozen=True)
class Gemma3Config:
    """Shape and hyper-parameters of a Gemma 3 text decoder.

    layer_types: one of GEMMA3_LAYER_TYPES per layer ("sliding_attention" layers see the last
    `sliding_window` positions: query i sees keys j with i - window < j <= i).
    rope_theta / rope_scaling: RoPE of the global ("full_attention") layers; rope_local_theta:
    RoPE of the sliding layers (never scaled). query_pre_attn_scalar: scores are q.k / sqrt(it).
    final_logit_softcapping: None, or c for logits = c * tanh(logits / c).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    layer_types: tuple[str, ...]
    sliding_window: int
    rope_theta: float = 1_000_000.0
    rope_local_theta: float = 10_000.0
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    query_pre_attn_scalar: float = 256.0
    final_logit_softcapping: float | None = None
    tie_word_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    arch: str = "gemma3"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "n_layers", "n_heads",
                     "n_kv_heads", "head_dim", "sliding_window"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"Gemma3Config.{name} must be a positive int, got {v!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads "
                             f"({self.n_kv_heads}) for grouped-query attention")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if len(self.layer_types) != self.n_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.n_layers} layers")
        bad = sorted({t for t in self.layer_types if t not in GEMMA3_LAYER_TYPES})
        if bad:
            raise ValueError(f"unknown layer type(s) {bad}; allowed: {', '.join(GEMMA3_LAYER_TYPES)}")
        if not self.query_pre_attn_scalar > 0:
            raise ValueError(f"query_pre_attn_scalar must be positive, got {self.query_pre_attn_scalar!r}")
        if self.final_logit_softcapping is not None and not self.final_logit_softcapping > 0:
            raise ValueError(f"final_logit_softcapping must be None or positive, got "
                             f"{self.final_logit_softcapping!r}")
        if self.rope_scaling is not None:
            kind = rope_scaling_type(self.rope_scaling)
            if kind not in ("default", "linear"):
                raise ValueError(f"unsupported Gemma 3 rope_scaling type {kind!r}; supported: None, 'default', "
                                 "'linear'")

    @property
    def gguf_qk_permuted(self) -> bool:
        """llama.cpp's converter keeps Gemma's q/k rows in HF order (NEOX-style RoPE): never permuted."""
        return False

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA ratio)."""
        return self.n_heads // self.n_kv_heads

    def is_sliding(self, layer: int) -> bool:
        return self.layer_types[layer] == "sliding_attention"

    def layer_window(self, layer: int) -> int | None:
        """The attention window of `layer`: `sliding_window` on sliding layers, None on global ones."""
        return self.sliding_window if self.is_sliding(layer) else None

    def rope_config(self, layer: int) -> LlamaConfig:
        """A LlamaConfig carrying only this layer's RoPE (theta, scaling, head_dim) for `rope_inv_freq`."""
        sliding = self.is_sliding(layer)
        return LlamaConfig(vocab_size=1, hidden_size=self.head_dim, intermediate_size=1, n_layers=1, n_heads=1,
                           n_kv_heads=1, head_dim=self.head_dim,
                           rope_theta=self.rope_local_theta if sliding else self.rope_theta,
                           rope_scaling=None if sliding else self.rope_scaling)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict; `Gemma3Config.from_dict(c.to_dict()) == c`."""
        d = asdict(self)
        d["layer_types"] = list(self.layer_types)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Gemma3Config":
        """Inverse of `to_dict` (unknown keys are rejected)."""
        return cls(**d)
