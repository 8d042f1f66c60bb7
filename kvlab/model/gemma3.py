"""A short, readable Gemma 3 text decoder in plain torch, with the same `AttentionBackend` protocol as
`LlamaModel`, so kvlab's dense and quantized-cache backends plug in unchanged.

Gemma 3 differs from Llama in: embeddings scaled by sqrt(hidden); RMSNorm computing x * (1 + w) in
float32; RMSNorm of q and k per head (qk-norm) before RoPE; a norm after attention and after the MLP
as well as before them; a GeGLU MLP (gelu, tanh approximation); scores scaled by
query_pre_attn_scalar ** -0.5; sliding-window layers (RoPE base 10K) mixed with global ones (RoPE
base 1M); tied embeddings; optional final logit soft-capping. Weights use HF names
(`model.layers.0.self_attn.q_norm.weight`, ...) with HF's norm convention (the stored w, used as 1 + w).

Per-layer attention reaches the backend through the `model` argument of `attend`: Gemma3Model passes a
per-layer view whose `config.sliding_window` is that layer's window (None on global layers) and whose
`apply_rope` rotates with that layer's RoPE; every other attribute is the model's. Backends compute
scores as q.k / sqrt(head_dim); when query_pre_attn_scalar != head_dim, q is rescaled before it is
handed over (so captured q are the scaled queries).
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kvlab.model.config import Gemma3Config, rope_inv_freq
from kvlab.model.llama import AttentionBackend, DenseCausalBackend, _CaptureBackend, _rope_apply


def _gemma_rms(x: Tensor, w: Tensor, eps: float) -> Tensor:
    """Gemma's RMSNorm: x / rms(x) * (1 + w), all in float32, cast back to x's dtype (as HF Gemma3RMSNorm)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w.float())).to(x.dtype)


class GemmaRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))  # HF convention: the scale is 1 + weight
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:  # [..., dim]
        return _gemma_rms(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, c: Gemma3Config) -> None:
        super().__init__()
        self.q_proj = nn.Linear(c.hidden_size, c.n_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.n_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.n_kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.n_heads * c.head_dim, c.hidden_size, bias=False)
        self.q_norm = GemmaRMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(c.head_dim, c.rms_norm_eps)


class MLP(nn.Module):
    def __init__(self, c: Gemma3Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:  # GeGLU
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, c: Gemma3Config) -> None:
        super().__init__()
        eps = c.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(c.hidden_size, eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = GemmaRMSNorm(c.hidden_size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(c.hidden_size, eps)
        self.mlp = MLP(c)
        self.post_feedforward_layernorm = GemmaRMSNorm(c.hidden_size, eps)


class _LayerConfig:
    """The model's config as one layer sees it: `sliding_window` is this layer's window (None: global)."""

    def __init__(self, config: Gemma3Config, layer: int) -> None:
        self._config, self.layer, self.sliding_window = config, layer, config.layer_window(layer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._config, name)


class LayerView:
    """What a backend's `attend(layer, ..., model)` receives from Gemma3Model for one layer: the model,
    with `config.sliding_window` and RoPE (`apply_rope`, `_rope`) of that layer."""

    def __init__(self, model: "Gemma3Model", layer: int) -> None:
        self._model, self.layer = model, layer
        self.config = _LayerConfig(model.config, layer)
        self._local = model.config.is_sliding(layer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def _rope(self, positions: Tensor, max_position: int | None = None) -> tuple[Tensor, Tensor]:
        return self._model._rope(positions, max_position, local=self._local)

    def apply_rope(self, x: Tensor, positions: Tensor, max_position: int | None = None,
                   cos_sin: tuple[Tensor, Tensor] | None = None) -> Tensor:
        return self._model.apply_rope(x, positions, max_position, cos_sin, layer=self.layer)


class Gemma3Model(nn.Module):
    """Gemma 3 text decoder. Build with `Gemma3Model.from_weights(config, hf_named_tensors)` or use
    `kvlab.model.load_model("gemma3")`. forward / capture / apply_rope as `LlamaModel`'s."""

    def __init__(self, config: Gemma3Config) -> None:
        super().__init__()
        c = self.config = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.norm = GemmaRMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        # plain attributes, not buffers: model.to(bfloat16) must not round the frequencies
        self.inv_freq = rope_inv_freq(c.rope_config(c.layer_types.index("full_attention"))
                                      if "full_attention" in c.layer_types else c.rope_config(0))
        self.inv_freq_local = rope_inv_freq(c.rope_config(c.layer_types.index("sliding_attention"))
                                            if "sliding_attention" in c.layer_types else c.rope_config(0))
        self._rope_tables: dict[bool, tuple[Tensor, Tensor]] = {}  # local? -> cos, sin [P, D] float32
        self._views = [LayerView(self, i) for i in range(c.n_layers)]
        # scores are q.k / sqrt(query_pre_attn_scalar); backends divide by sqrt(head_dim)
        self.q_scale = math.sqrt(c.head_dim / c.query_pre_attn_scalar)

    # ---- weights -------------------------------------------------------------------------
    @classmethod
    def from_weights(cls, config: Gemma3Config, tensors: dict[str, Tensor], device: str | torch.device = "cpu",
                     dtype: torch.dtype = torch.float32, copy: bool = True) -> "Gemma3Model":
        """An inference-ready model (eval, no grad) from HF-named tensors, without a random init."""
        with torch.device("meta"):
            model = cls(config)
        cast = {k: v.to(device=device, dtype=dtype, copy=copy) for k, v in tensors.items()}
        model.load_state_dict(cast, assign=True)
        return model.requires_grad_(False).eval()

    def load_state_dict(self, state: dict[str, Tensor], strict: bool = True, assign: bool = False):  # type: ignore[override]
        """Load HF-named weights (`model.embed_tokens.weight`, ...); `lm_head.weight` may be absent when tied."""
        own = {(name[len("model."):] if name.startswith("model.") else name): t for name, t in state.items()}
        if self.config.tie_word_embeddings:
            own.pop("lm_head.weight", None)
            own["lm_head.weight"] = own["embed_tokens.weight"]
        return super().load_state_dict(own, strict=strict, assign=assign)

    @staticmethod
    def expected_shapes(config: Gemma3Config) -> dict[str, tuple[int, ...]]:
        """HF name -> shape of every tensor the model needs (no lm_head when tied)."""
        with torch.device("meta"):
            model = Gemma3Model(config)
        return {(k if k.startswith("lm_head.") else f"model.{k}"): tuple(v.shape)
                for k, v in model.state_dict().items()
                if not (config.tie_word_embeddings and k.startswith("lm_head."))}

    # ---- RoPE ----------------------------------------------------------------------------
    def _rope(self, positions: Tensor, max_position: int | None = None, local: bool = False) -> tuple[Tensor, Tensor]:
        """cos, sin [T, D] (or [B, T, D]) float32 of the local (sliding) or global RoPE, from a cached table."""
        need = (int(positions.max()) if max_position is None else max_position) + 1 if positions.numel() else 1
        dev = self.embed_tokens.weight.device
        table = self._rope_tables.get(local)
        if table is None or table[0].shape[0] < need or table[0].device != dev:
            old = 0 if table is None else table[0].shape[0]
            n = max(4096, old, 1 << (need - 1).bit_length())
            freqs = torch.arange(n, dtype=torch.float32, device=dev)[:, None] \
                * (self.inv_freq_local if local else self.inv_freq).to(dev)[None, :]  # [P, D/2]
            emb = torch.cat([freqs, freqs], dim=-1)  # [P, D]
            table = self._rope_tables[local] = (emb.cos(), emb.sin())
        return table[0][positions], table[1][positions]

    @property
    def rope_positions(self) -> int:
        """Positions every cached RoPE table covers."""
        return min((t[0].shape[0] for t in self._rope_tables.values()), default=0)

    def apply_rope(self, x: Tensor, positions: Tensor, max_position: int | None = None,
                   cos_sin: tuple[Tensor, Tensor] | None = None, layer: int | None = None) -> Tensor:
        """Rotate x [B, H, T, D] by positions [T] or [B, T] with the RoPE of `layer` (rotate-half, HF).
        Gemma 3 rotates sliding and global layers with different bases, so `layer` is required unless
        cos_sin is given."""
        if cos_sin is None:
            if layer is None:
                raise ValueError("Gemma 3 rotates sliding and global layers with different RoPE bases: pass layer= "
                                 "(or use the per-layer view a backend receives)")
            cos_sin = self._rope(positions.to(self.embed_tokens.weight.device), max_position,
                                 local=self.config.is_sliding(layer))
        return _rope_apply(x, *cos_sin)

    def layer_view(self, layer: int) -> LayerView:
        """The per-layer view backends receive as `model` for `layer`."""
        return self._views[layer]

    # ---- forward -------------------------------------------------------------------------
    def forward(self, tokens: Tensor, positions: Tensor | None = None, backend: AttentionBackend | None = None,
                last: int | None = None, max_position: int | None = None) -> Tensor:
        """tokens [B, T] int; positions [T] or [B, T] (default: after what `backend` holds); backend: where
        K/V live (default a fresh DenseCausalBackend); last: logits of the last `last` positions only.
        Returns float32 logits [B, T or last, V] (soft-capped if the config says so)."""
        if last is not None and not 1 <= last <= tokens.shape[-1]:
            raise ValueError(f"last={last} must be between 1 and the {tokens.shape[-1]} tokens given")
        return self._run(tokens, positions, backend, last=last, max_position=max_position)[0]

    @torch.no_grad()
    def capture(self, tokens: Tensor, positions: Tensor | None = None, hidden_states: bool = False) -> dict:
        """Dense forward recording per-layer float32 q (post-norm, post-RoPE, scaled as the backend gets
        it), k_pre (post-norm, pre-RoPE), k, v, plus "logits", "positions" (and "hidden_states")."""
        rec = _CaptureBackend()
        logits, hs = self._run(tokens, positions, rec, want_hidden=hidden_states)
        out = {"q": rec.q, "k_pre": rec.k_pre, "k": rec.k, "v": rec.v, "logits": logits, "positions": rec.positions}
        if hidden_states:
            out["hidden_states"] = hs
        return out

    def _run(self, tokens: Tensor, positions: Tensor | None, backend: AttentionBackend | None,
             want_hidden: bool = False, last: int | None = None, max_position: int | None = None):
        c = self.config
        if tokens.dim() != 2 or tokens.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"tokens must be an integer tensor [B, T], got {tuple(tokens.shape)} {tokens.dtype}")
        backend = DenseCausalBackend() if backend is None else backend
        B, T = tokens.shape
        dev = self.embed_tokens.weight.device
        if positions is None:
            start = int(getattr(backend, "seq_len", 0))
            positions, max_position = torch.arange(start, start + T, device=dev), start + T - 1
        positions = positions.to(device=dev, dtype=torch.int64)
        if positions.shape not in ((T,), (B, T)):
            raise ValueError(f"positions must be [T]={T} or [B, T]={B, T} int64, got {tuple(positions.shape)}")
        if positions.dim() == 2 and isinstance(backend, DenseCausalBackend):
            raise ValueError("per-sequence positions [B, T] need a backend that holds sequences of different "
                             "lengths; the dense backend takes positions [T]")
        rope = {local: self._rope(positions, max_position, local) for local in (False, True)}
        x = self.embed_tokens(tokens.to(dev))
        x = x * torch.tensor(c.hidden_size ** 0.5, dtype=x.dtype)  # HF rounds the normalizer to the dtype
        hidden = [x.float()] if want_hidden else []
        Hq, Hk, D = c.n_heads, c.n_kv_heads, c.head_dim
        for i, blk in enumerate(self.layers):
            a = blk.self_attn
            h = blk.input_layernorm(x)
            q = a.q_norm(a.q_proj(h).view(B, T, Hq, D).transpose(1, 2))        # [B, Hq, T, D]
            k_pre = a.k_norm(a.k_proj(h).view(B, T, Hk, D).transpose(1, 2))    # [B, Hk, T, D]
            v = a.v_proj(h).view(B, T, Hk, D).transpose(1, 2)                  # [B, Hk, T, D]
            cos, sin = rope[c.is_sliding(i)]
            q, k = _rope_apply(q, cos, sin), _rope_apply(k_pre, cos, sin)
            if self.q_scale != 1.0:
                q = q * self.q_scale
            o = backend.attend(i, q, k_pre, k, v, positions, self._views[i])   # [B, Hq, T, D]
            o = a.o_proj(o.transpose(1, 2).reshape(B, T, Hq * D))
            x = x + blk.post_attention_layernorm(o)
            x = x + blk.post_feedforward_layernorm(blk.mlp(blk.pre_feedforward_layernorm(x)))
            if want_hidden:
                hidden.append(x.float())
        if last is not None:
            x = x[:, -last:]
        logits = self.lm_head(self.norm(x)).float()
        if c.final_logit_softcapping is not None:
            cap = c.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return logits, hidden


# ---- tokenizer -------------------------------------------------------------------------------
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types


def gemma_tokenizer_from_gguf_fields(fields: dict[str, Any]):
    """Gemma's SentencePiece-BPE tokenizer (`tokenizer.ggml.model == "llama"`) as a `tokenizers.Tokenizer`.

    The GGUF holds no merges: they are rebuilt from the vocabulary, ranked by the merged token's position
    in the file (Gemma's scores do not follow its merge order, the order of the tokens does), as
    transformers' GGUF conversion does; tokens made only of spaces are stored as spaces and respelled with
    "▁". BPE with byte fallback, " " -> "▁" normalizer, no prefix space; control tokens (type 3) are
    special, user-defined ones (type 4) plain added tokens. BOS is added when `add_bos_token`.
    Raises ValueError for another tokenizer model.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE

    if fields.get("model") != "llama":
        raise ValueError(f"GGUF tokenizer model {fields.get('model')!r} is not Gemma's; expected 'llama' "
                         "(SentencePiece)")
    raw = list(fields["tokens"])
    tokens = ["\u2581" * len(t) if t and " " in t and not t.strip() else t for t in raw]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for rank, tok in enumerate(tokens):  # a token's splits into two vocabulary pieces, best-ranked first
        local = [(tok[:j], tok[j:]) for j in range(1, len(tok)) if tok[:j] in vocab and tok[j:] in vocab]
        local.sort(key=lambda p: (vocab[p[0]], vocab[p[1]]))
        merges.extend((rank, p) for p in local)
    merges.sort(key=lambda m: (-m[0], len(m[1][0]), len(m[1][1])), reverse=True)
    unk = raw[fields["unknown_token_id"]] if fields.get("unknown_token_id") is not None else "<unk>"
    tok = Tokenizer(BPE(vocab=vocab, merges=[p for _, p in merges], fuse_unk=True, unk_token=unk, dropout=None,
                        byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    types = fields.get("token_type") or []
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(raw, types) if ty == _CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, ty in zip(tokens, types) if ty == _USER_DEFINED])
    bos = fields.get("bos_token_id")
    if fields.get("add_bos_token") and bos is not None:
        name = raw[bos]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{name}:0 $A:0", pair=f"{name}:0 $A:0 $B:1", special_tokens=[(name, bos)])
    return tok
