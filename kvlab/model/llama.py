"""A short, readable Llama-family decoder (Llama, Mistral, Qwen2) in plain torch.

RMSNorm, RoPE (rotate-half convention, as HF transformers), grouped-query attention, SwiGLU,
tied or separate lm_head, optional q/k/v bias. Attention itself is delegated to an
`AttentionBackend`, so a quantized KV cache can be plugged in without touching the model.
Weights use HF names (`model.layers.0.self_attn.q_proj.weight`, ...), see `load_state_dict`.
"""
from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kvlab.model.config import LlamaConfig, rope_inv_freq

class AttentionBackend(Protocol):
    """Where the keys and values of every layer live, and how new queries attend to them."""

    def attend(self, layer: int, q: Tensor, k_pre: Tensor, k: Tensor, v: Tensor, positions: Tensor,
               model: "LlamaModel") -> Tensor:
        """q: [B, Hq, T, D] after RoPE; k_pre: [B, Hk, T, D] keys BEFORE RoPE; k: [B, Hk, T, D] after RoPE; v: [B, Hk, T, D];
        positions: [T] int64 absolute positions of these T new tokens. Returns [B, Hq, T, D]: causal attention of the
        new tokens over everything the backend holds for this layer plus the new tokens."""
        ...


def causal_attention(q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, k_pos: Tensor,
                     sliding_window: int | None = None) -> Tensor:
    """Float32 causal GQA attention by absolute position.

    q: [B, Hq, T, D]; k, v: [B, Hk, S, D]; q_pos: [T] int64; k_pos: [S] int64.
    Query i sees key j iff k_pos[j] <= q_pos[i] (and q_pos[i] - k_pos[j] < sliding_window).
    Returns [B, Hq, T, D] in q's dtype; softmax and dots run in float32.
    """
    B, Hq, T, D = q.shape
    Hk, S = k.shape[1], k.shape[2]
    if (sliding_window is None and S == T and B * Hq * T * T <= MAX_SCORES and torch.equal(q_pos, k_pos)
            and bool((q_pos[1:] > q_pos[:-1]).all())):
        # plain prefill: the mask is the lower triangle, and is_causal lets SDPA skip its upper half.
        # (Float32 SDPA with GQA runs the math kernel on CUDA, which materializes the scores: longer
        # prefills take the chunked path below.)
        out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True,
                                             enable_gqa=Hq != Hk)
        return out.to(q.dtype)
    allowed = k_pos[None, :] <= q_pos[:, None]  # [T, S]
    if sliding_window is not None:
        allowed &= k_pos[None, :] > q_pos[:, None] - sliding_window
    # explicit GQA: the G query heads of a KV head share one matmul (fast for decode, T small);
    # queries in chunks so that no chunk holds more than MAX_SCORES scores
    G, rows = Hq // Hk, max(1, MAX_SCORES // (B * Hq * S))
    kf, vf = k.float().transpose(-1, -2), v.float()
    out = torch.empty(B, Hq, T, D, dtype=q.dtype, device=q.device)
    for i in range(0, T, rows):
        t = min(rows, T - i)
        qg = q[:, :, i:i + t].float().reshape(B, Hk, G * t, D)              # [B, Hk, G*t, D]
        s = (qg @ kf) * D ** -0.5                                           # [B, Hk, G*t, S]
        s = s.view(B, Hk, G, t, S).masked_fill(~allowed[i:i + t], float("-inf"))
        o = torch.softmax(s, dim=-1).view(B, Hk, G * t, S) @ vf             # [B, Hk, G*t, D]
        out[:, :, i:i + t] = o.view(B, Hq, t, D).to(q.dtype)
    return out


MAX_SCORES = 1 << 26  # attention scores held at once (256 MB in float32); longer inputs are chunked


class DenseCausalBackend:
    """Default backend: a full-precision per-layer cache of post-RoPE keys and values.

    Feeding a prompt of T tokens and then one token at a time gives the same logits as one
    forward over the whole sequence. Keys/values are kept in the model dtype, in buffers that
    grow by doubling (appending a token does not copy the whole cache).
    """

    def __init__(self) -> None:
        self._k: dict[int, Tensor] = {}    # layer -> [B, Hk, capacity, D] post-RoPE
        self._v: dict[int, Tensor] = {}    # layer -> [B, Hk, capacity, D]
        self._pos: dict[int, Tensor] = {}  # layer -> [capacity] int64
        self._n: dict[int, int] = {}       # layer -> tokens held

    @property
    def seq_len(self) -> int:
        """Tokens held for layer 0 (the next default position)."""
        return self._n.get(0, 0)

    def keys(self, layer: int) -> tuple[Tensor, Tensor, Tensor]:
        """(k [B, Hk, S, D] post-RoPE, v [B, Hk, S, D], positions [S]) held for `layer` (views)."""
        n = self._n[layer]
        return self._k[layer][:, :, :n], self._v[layer][:, :, :n], self._pos[layer][:n]

    def reset(self) -> None:
        """Drop every cached key and value."""
        self._k.clear(), self._v.clear(), self._pos.clear(), self._n.clear()

    def attend(self, layer: int, q: Tensor, k_pre: Tensor, k: Tensor, v: Tensor, positions: Tensor,
               model: "LlamaModel") -> Tensor:
        """See `AttentionBackend.attend`; appends k, v to this layer's cache first."""
        n, T = self._n.get(layer, 0), k.shape[2]
        if layer not in self._k or n + T > self._k[layer].shape[2]:
            cap = max(2 * n, n + T, 64)
            kb, vb = k.new_empty(*k.shape[:2], cap, k.shape[3]), v.new_empty(*v.shape[:2], cap, v.shape[3])
            pb = positions.new_empty(cap)
            if n:
                kb[:, :, :n], vb[:, :, :n], pb[:n] = self.keys(layer)
            self._k[layer], self._v[layer], self._pos[layer] = kb, vb, pb
        self._k[layer][:, :, n:n + T] = k
        self._v[layer][:, :, n:n + T] = v
        self._pos[layer][n:n + T] = positions
        self._n[layer] = n + T
        k_all, v_all, k_pos = self.keys(layer)
        return causal_attention(q, k_all, v_all, positions, k_pos, model.config.sliding_window)


class RMSNorm(nn.Module):
    """y = w * x / rms(x), computed in float32 and cast back (as HF LlamaRMSNorm)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:  # [..., dim]
        return _rms(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        b = c.attention_bias
        self.q_proj = nn.Linear(c.hidden_size, c.n_heads * c.head_dim, bias=b)
        self.k_proj = nn.Linear(c.hidden_size, c.n_kv_heads * c.head_dim, bias=b)
        self.v_proj = nn.Linear(c.hidden_size, c.n_kv_heads * c.head_dim, bias=b)
        self.o_proj = nn.Linear(c.n_heads * c.head_dim, c.hidden_size, bias=c.o_proj_bias)


class MLP(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:  # SwiGLU
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)


class LlamaModel(nn.Module):
    """Llama-family decoder. Build with `LlamaModel(config)` then `load_state_dict(hf_named)`,
    or use `kvlab.model.load_model`."""

    def __init__(self, config: LlamaConfig, rope_freq_factors: Tensor | None = None) -> None:
        """rope_freq_factors: optional float32 [head_dim // 2] divisors of the RoPE frequencies
        (llama.cpp's `rope_freqs.weight`, used by Llama-3.1 GGUFs instead of rope_scaling)."""
        super().__init__()
        c = self.config = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        inv_freq = rope_inv_freq(c)
        if rope_freq_factors is not None:
            inv_freq = inv_freq / rope_freq_factors.float()
        # a plain attribute, not a buffer: model.to(bfloat16) must not round the frequencies
        self.inv_freq = inv_freq  # [D/2] float32, CPU
        self._rope_table: tuple[Tensor, Tensor] | None = None  # cos, sin [P, D] float32
        self._step_fns = None  # compile_decode: (layer_in, layer_out, per-layer fused weights in, out)

    # ---- weights -------------------------------------------------------------------------
    @classmethod
    def from_weights(cls, config: LlamaConfig, tensors: dict[str, Tensor], device: str | torch.device = "cpu",
                     dtype: torch.dtype = torch.float32, rope_freq_factors: Tensor | None = None,
                     copy: bool = True) -> "LlamaModel":
        """Build an inference-ready model (eval, no grad) from HF-named tensors without a random
        init (parameters start on the meta device). copy=False lets parameters share memory with
        `tensors` when device and dtype already match."""
        with torch.device("meta"):
            model = cls(config, rope_freq_factors)
        cast = {k: v.to(device=device, dtype=dtype, copy=copy) for k, v in tensors.items()}
        model.load_state_dict(cast, assign=True)
        return model.requires_grad_(False).eval()

    def load_state_dict(self, state: dict[str, Tensor], strict: bool = True, assign: bool = False):  # type: ignore[override]
        """Load HF-named weights (`model.embed_tokens.weight`, `lm_head.weight`, ...).
        `lm_head.weight` may be absent when embeddings are tied."""
        own = {}
        for name, t in state.items():
            own[name[len("model."):] if name.startswith("model.") else name] = t
        if self.config.tie_word_embeddings:
            own.pop("lm_head.weight", None)
            own["lm_head.weight"] = own["embed_tokens.weight"]
        own.pop("rotary_emb.inv_freq", None)
        return super().load_state_dict(own, strict=strict, assign=assign)

    # ---- RoPE ----------------------------------------------------------------------------
    def _rope(self, positions: Tensor, max_position: int | None = None) -> tuple[Tensor, Tensor]:
        """cos, sin for `positions` [T] -> each [T, D] float32 (cached table, grown on demand).
        max_position: a known bound on positions (saves a device sync); default: computed."""
        need = (int(positions.max()) if max_position is None else max_position) + 1 if positions.numel() else 1
        dev = self.embed_tokens.weight.device
        if self._rope_table is None or self._rope_table[0].shape[0] < need or self._rope_table[0].device != dev:
            old = 0 if self._rope_table is None else self._rope_table[0].shape[0]
            n = max(4096, old, 1 << (need - 1).bit_length())  # grow by powers of two, never shrink
            pos = torch.arange(n, dtype=torch.float32, device=dev)
            freqs = pos[:, None] * self.inv_freq.to(dev)[None, :]  # [P, D/2], fp32 like HF
            emb = torch.cat([freqs, freqs], dim=-1)         # [P, D]
            self._rope_table = (emb.cos(), emb.sin())
        cos, sin = self._rope_table
        return cos[positions], sin[positions]

    @property
    def rope_positions(self) -> int:
        """Positions the cached RoPE table covers (after a forward: at least every position it saw)."""
        return 0 if self._rope_table is None else int(self._rope_table[0].shape[0])

    def apply_rope(self, x: Tensor, positions: Tensor, max_position: int | None = None,
                   cos_sin: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """Rotate x: [B, H, T, D] by absolute positions [T] or [B, T] (int64), HF rotate-half convention.
        Returns [B, H, T, D] in x's dtype (cos/sin computed in float32 and cast, as HF).
        max_position: a known bound on positions (no device sync); cos_sin: `_rope(positions)`
        computed once for several tensors."""
        cos, sin = cos_sin or self._rope(positions.to(self.embed_tokens.weight.device), max_position)
        return _rope_apply(x, cos, sin)

    def compile_decode(self, **kw) -> "LlamaModel":
        """Run the dense parts of each layer (norms, projections, RoPE, MLP) of one-token forwards through
        `torch.compile` (fused elementwise kernels), with the q/k/v projections and the gate/up projections
        each as one matmul over concatenated weights (copies: about 70% more weight memory): fewer launches
        per decode step. Attention stays with the backend; longer forwards are unchanged. kw goes to
        torch.compile (default dynamic=False). Returns self."""
        kw.setdefault("dynamic", False)
        w_in, w_out = [], []
        for blk in self.layers:
            ln, wq, bq, wk, bk, wv, bv = _in_weights(blk)
            bias = None if bq is None else torch.cat([bq, bk, bv])
            w_in.append((ln, torch.cat([wq, wk, wv]), bias))
            wo, bo, ln2, wg, wu, wd = _out_weights(blk)
            w_out.append((wo, bo, ln2, torch.cat([wg, wu]), wd))
        self._step_fns = (torch.compile(_layer_in_fused, **kw), torch.compile(_layer_out_fused, **kw), w_in, w_out)
        return self

    # ---- forward -------------------------------------------------------------------------
    def forward(self, tokens: Tensor, positions: Tensor | None = None,
                backend: AttentionBackend | None = None, last: int | None = None,
                max_position: int | None = None) -> Tensor:
        """tokens: LongTensor [B, T]; positions: LongTensor [T] of absolute positions (default:
        continue after what `backend` holds, i.e. `backend.seq_len` if it has one, else 0..T-1), or
        [B, T], one row per sequence (for backends that hold sequences of different lengths, as
        `kvlab.generate`'s; the dense default backend takes [T] only); backend: where K/V live
        (default: a fresh `DenseCausalBackend`); last: compute logits for the last `last` positions
        only (default all; the LM head of a long prompt is costly); max_position: a bound on the
        given positions, which spares a device sync (needed inside CUDA-graph capture).
        Returns logits [B, T or last, V] float32."""
        if last is not None and not 1 <= last <= tokens.shape[-1]:
            raise ValueError(f"last={last} must be between 1 and the {tokens.shape[-1]} tokens given")
        return self._run(tokens, positions, backend, last=last, max_position=max_position)[0]

    @torch.no_grad()
    def capture(self, tokens: Tensor, positions: Tensor | None = None,
                hidden_states: bool = False) -> dict[str, object]:
        """Run a dense forward and return what attention saw, for evaluation.

        Returns a dict: "q", "k_pre", "k", "v": lists (one per layer) of float32 tensors
        [B, Hq, T, D] (q, post-RoPE) / [B, Hk, T, D] (k_pre before RoPE, k post-RoPE, v);
        "logits": [B, T, V] float32; "positions": [T]; and if hidden_states, "hidden_states":
        list of n_layers + 1 float32 [B, T, hidden] (embeddings, then each block's output).
        """
        rec = _CaptureBackend()
        logits, hs = self._run(tokens, positions, rec, want_hidden=hidden_states)
        out: dict[str, object] = {"q": rec.q, "k_pre": rec.k_pre, "k": rec.k, "v": rec.v,
                                  "logits": logits, "positions": rec.positions}
        if hidden_states:
            out["hidden_states"] = hs
        return out

    def _run(self, tokens: Tensor, positions: Tensor | None, backend: AttentionBackend | None,
             want_hidden: bool = False, last: int | None = None,
             max_position: int | None = None) -> tuple[Tensor, list[Tensor]]:
        c = self.config
        if tokens.dim() != 2 or tokens.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"tokens must be an integer tensor [B, T], got {tuple(tokens.shape)} "
                             f"{tokens.dtype}")
        backend = DenseCausalBackend() if backend is None else backend
        B, T = tokens.shape
        dev = self.embed_tokens.weight.device
        if positions is None:  # known on the host when positions are implied: no device sync per forward
            start = int(getattr(backend, "seq_len", 0))
            positions, max_position = torch.arange(start, start + T, device=dev), start + T - 1
        positions = positions.to(device=dev, dtype=torch.int64)
        if positions.shape not in ((T,), (B, T)):
            raise ValueError(f"positions must be [T]={T} or [B, T]={B, T} int64, got {tuple(positions.shape)}")
        if positions.dim() == 2 and isinstance(backend, DenseCausalBackend):
            raise ValueError("per-sequence positions [B, T] need a backend that holds sequences of different "
                             "lengths (kvlab.generate.PagedBackend); the dense backend takes positions [T]")
        cos_sin = self._rope(positions, max_position)  # once per forward, shared by every layer
        x = self.embed_tokens(tokens.to(dev))  # [B, T, H]
        hidden = [x.float()] if want_hidden else []
        step = self._step_fns if T == 1 else None  # compile_decode's fused, compiled layer parts
        for i, blk in enumerate(self.layers):
            w_in = step[2][i] if step else _in_weights(blk)
            q, k_pre, k, v = (step[0] if step else _layer_in)(x, *w_in, cos_sin[0], cos_sin[1], c.n_heads,
                                                              c.n_kv_heads, c.head_dim, c.rms_norm_eps)
            o = backend.attend(i, q, k_pre, k, v, positions, self)                  # [B, Hq, T, D]
            x = (step[1] if step else _layer_out)(x, o, *(step[3][i] if step else _out_weights(blk)), c.rms_norm_eps)
            if want_hidden:
                hidden.append(x.float())
        if last is not None:
            x = x[:, -last:]
        return self.lm_head(self.norm(x)).float(), hidden


def _rms(x: Tensor, w: Tensor, eps: float) -> Tensor:
    """RMSNorm on plain tensors: w * x / rms(x), in float32 and cast back (as HF LlamaRMSNorm)."""
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rope_apply(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B, H, T, D] rotated by cos, sin ([T, D], or [B, T, D] for per-sequence positions; float32, cast to
    x's dtype as HF does)."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, T, D]
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def _in_weights(blk) -> tuple:
    a = blk.self_attn
    return (blk.input_layernorm.weight, a.q_proj.weight, a.q_proj.bias, a.k_proj.weight, a.k_proj.bias,
            a.v_proj.weight, a.v_proj.bias)


def _out_weights(blk) -> tuple:
    m = blk.mlp
    return (blk.self_attn.o_proj.weight, blk.self_attn.o_proj.bias, blk.post_attention_layernorm.weight,
            m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight)


def _layer_in(x, ln, wq, bq, wk, bk, wv, bv, cos, sin, Hq: int, Hk: int, D: int, eps: float):
    """A block up to attention: x [B, T, H] -> q [B, Hq, T, D] (RoPE'd), k_pre, k (RoPE'd), v [B, Hk, T, D]."""
    B, T = x.shape[0], x.shape[1]
    h = _rms(x, ln, eps)
    q = F.linear(h, wq, bq).view(B, T, Hq, D).transpose(1, 2)
    k_pre = F.linear(h, wk, bk).view(B, T, Hk, D).transpose(1, 2)
    v = F.linear(h, wv, bv).view(B, T, Hk, D).transpose(1, 2)
    return _rope_apply(q, cos, sin), k_pre, _rope_apply(k_pre, cos, sin), v


def _layer_out(x, o, wo, bo, ln, wg, wu, wd, eps: float):
    """The rest of a block: x + o_proj(o), then x + SwiGLU(norm(x)). o [B, Hq, T, D] -> x [B, T, H]."""
    B, T = x.shape[0], x.shape[1]
    x = x + F.linear(o.transpose(1, 2).reshape(B, T, -1), wo, bo)
    h = _rms(x, ln, eps)
    return x + F.linear(F.silu(F.linear(h, wg)) * F.linear(h, wu), wd)


def _layer_in_fused(x, ln, wqkv, bqkv, cos, sin, Hq: int, Hk: int, D: int, eps: float):
    """`_layer_in` with the q/k/v weights concatenated [(Hq + 2 Hk) D, H]: one matmul."""
    B, T = x.shape[0], x.shape[1]
    qkv = F.linear(_rms(x, ln, eps), wqkv, bqkv).view(B, T, Hq + 2 * Hk, D).transpose(1, 2)
    q, k_pre, v = qkv.split([Hq, Hk, Hk], dim=1)
    return _rope_apply(q, cos, sin), k_pre, _rope_apply(k_pre, cos, sin), v


def _layer_out_fused(x, o, wo, bo, ln, wgu, wd, eps: float):
    """`_layer_out` with the gate and up weights concatenated [2 I, H]: one matmul."""
    B, T = x.shape[0], x.shape[1]
    x = x + F.linear(o.transpose(1, 2).reshape(B, T, -1), wo, bo)
    g, u = F.linear(_rms(x, ln, eps), wgu).chunk(2, dim=-1)
    return x + F.linear(F.silu(g) * u, wd)


class _CaptureBackend:
    """Dense attention over the new tokens only that records float32 q, k_pre, k, v per layer."""

    def __init__(self) -> None:
        self.q: list[Tensor] = []
        self.k_pre: list[Tensor] = []
        self.k: list[Tensor] = []
        self.v: list[Tensor] = []
        self.positions: Tensor | None = None

    def attend(self, layer, q, k_pre, k, v, positions, model):  # noqa: D102
        self.q.append(q.float()), self.k_pre.append(k_pre.float())
        self.k.append(k.float()), self.v.append(v.float())
        self.positions = positions
        return causal_attention(q, k, v, positions, positions, model.config.sliding_window)
