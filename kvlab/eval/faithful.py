"""Decode-faithful attention through a quantized cache, computed in parallel.

What a decoding engine sees at step t: every key/value 0..t as its cache holds them after token
t was stored. A token is held in full precision while it is one of the first `sink` tokens or
one of the `window` most recent ones, and (for channel-axis specs) while its group of G tokens
has not entirely left the window; otherwise it is held quantized. Quantizing one token (or one
completed channel group) never depends on later tokens, so the quantized history is one fixed
tensor and step t only chooses, key by key, between the full-precision and the quantized copy.
That makes a whole sequence one parallel pass, equal to incremental decode (tested against the
paged pool). Static per-tensor scales (axis tensor, NVFP4's fp32 scale) come from a separate
calibration pass (`calibrate`), never from the text being scored.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor

from ..cache.window import FpPolicy
from ..model.llama import MAX_SCORES  # scores one float32 attention call may hold; more queries are split
from ..quant import fake_quantize, fit_codebook, quantize
from ..spec import KVQuantSpec, KVScheme, as_scheme
from .engine_space import engine_space

MASK_CACHE_MAX = 1 << 26  # bool elements of one chunk's mask that a forward keeps for its later layers


def fp_mask(spec: KVQuantSpec, policy: FpPolicy, q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """[T, S] bool: True where the query at q_pos reads the key/value at k_pos in full precision.

    The pool's policy (kvlab.cache.window.FpPolicy, one for K and V): with n = t + 1 tokens held,
    positions [sink, sink + nq(n)) are quantized, nq(n) = floor((n - sink - window) / Gc) * Gc,
    Gc = lcm of the scheme's channel groups (1 without). bf16/fp16 specs are never quantized.
    """
    t, s = q_pos[:, None], k_pos[None, :]
    if spec.is_float_storage:
        return torch.ones(t.shape[0], s.shape[1], dtype=torch.bool, device=q_pos.device)
    nq = (t + 1 - policy.sink - policy.window).clamp(min=0) // policy.group * policy.group
    return (s < policy.sink) | (s >= policy.sink + nq)


def quantized_history(x: Tensor, spec: KVQuantSpec, sch: KVScheme, calib: dict | None = None,
                      prev: Tensor | None = None, codec=None) -> Tensor:
    """Dequantized copy of x [B, H, S, D] as the cache would hold each token once quantized.

    Tokens that can never be quantized yet (sinks, an unfinished channel group) keep x's values
    (the mask decides whether they are read). float32. `prev`: this function's result for a
    prefix of x; its finished tokens (whole channel groups) are reused and only the rest is
    quantized, so one decode step costs O(new tokens).
    """
    x = x.float()
    if spec.is_float_storage:
        return fake_quantize(x, spec).float()
    S = x.shape[2]
    lo = min(sch.sink, S)
    G = spec.group if spec.axis == "chan" else 1
    hi = lo + (S - lo) // G * G
    start = lo
    if prev is not None and prev.shape[2] > lo:
        start = lo + (prev.shape[2] - lo) // G * G  # prev holds final values for [lo, start)
    out = torch.cat([prev[:, :, :start].float(), x[:, :, start:]], dim=2) if start > lo else x.clone()
    if hi > start:
        part = x[:, :, start:hi].contiguous()
        out[:, :, start:hi] = codec(part) if codec is not None else fake_quantize(part, spec, **(calib or {})).float()
    return out


def head_histories(k: Tensor, v: Tensor, groups, sch: KVScheme, pk: Tensor | None = None,
                   pv: Tensor | None = None) -> tuple[Tensor, Tensor, KVQuantSpec, KVQuantSpec]:
    """`quantized_history` of a layer with per-head specs: k, v [B, Hk, S, D]; groups: `KVScheme.head_groups`
    [((K spec, V spec), heads)]; pk, pv: this function's result for a prefix (reused as `prev`). Returns the float32
    copies and the K and V specs whose full-precision masks the layer's attention uses (`mask_spec`)."""
    kq = torch.empty(k.shape, dtype=torch.float32, device=k.device)
    vq = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    for (ks, vs), heads in groups:
        h = torch.tensor(heads, dtype=torch.long, device=k.device)
        kq[:, h] = quantized_history(k[:, h], ks, sch, None, None if pk is None else pk[:, h])
        vq[:, h] = quantized_history(v[:, h], vs, sch, None, None if pv is None else pv[:, h])
    return kq, vq, mask_spec([ks for (ks, _), _ in groups]), mask_spec([vs for (_, vs), _ in groups])


def mask_spec(specs: list[KVQuantSpec]) -> KVQuantSpec:
    """The spec whose full-precision mask a layer of per-head `specs` uses: a quantized one if any (the pool's one
    policy holds the same tokens full precision in every head; a bf16 head's pages read back its values rounded to
    bf16, which its quantized history holds), else the first."""
    return next((s for s in specs if not s.is_float_storage), specs[0])


class DecodeFaithfulBackend:
    """`AttentionBackend` that scores a quantized cache decode-faithfully (see module doc).

    Works for a whole sequence at once (parallel scoring) and incrementally (prefill, then one
    token at a time: keeps full-precision history and re-derives the quantized copy).
    calib: {layer: {"k": {...}, "v": {...}}} static-scale kwargs for `quantize` (see `calibrate`).
    """

    def __init__(self, scheme, n_layers: int, calib: dict | None = None, q_chunk: int = 2048) -> None:
        self.scheme = as_scheme(scheme)
        self.n_layers = n_layers
        self.policy = FpPolicy.of(self.scheme, n_layers)
        self.calib = calib or {}
        eng = self.scheme.engine
        for layer in range(n_layers):
            for name, spec in zip("kv", self.scheme.for_layer(layer, n_layers)):
                if eng is not None and getattr(eng, f"{name}_codec"):
                    continue  # the engine's codec fixes its own scales (e.g. NVFP4's tensor scale at 1.0)
                if needs_calibration(spec) and name not in self.calib.get(layer, {}):
                    raise ValueError(f"layer {layer} {name.upper()} spec {spec} keeps a static per-tensor scale; pass "
                                     "calib=calibrate(model, calibration_tokens, scheme) (a scale taken from the scored "
                                     "text itself would depend on tokens not yet decoded)")
        self.q_chunk = q_chunk
        self.hist: dict[int, tuple[Tensor, Tensor, Tensor, Tensor]] = {}  # layer -> k_pre, k, v, pos
        self.qhist: dict[int, tuple[Tensor, Tensor]] = {}  # layer -> quantized copies (K source, V)
        self._masks_for: Tensor | None = None  # the positions tensor of the forward whose masks are cached
        self._masks: dict = {}

    @property
    def seq_len(self) -> int:
        return int(self.hist[0][3].numel()) if 0 in self.hist else 0

    def reset(self) -> None:
        self.hist.clear()
        self.qhist.clear()
        self._masks_for, self._masks = None, {}

    def truncate(self, n: int) -> None:
        """Forget every token after the first n (a rejected speculative draft). The quantized
        copies stay valid: quantizing a token never depends on later ones, and an unfinished
        channel group is re-derived from the full-precision history on the next call."""
        if not 0 <= n <= self.seq_len:
            raise ValueError(f"cannot truncate {self.seq_len} held tokens to {n}")
        self.hist = {i: (a[:, :, :n], b[:, :, :n], c[:, :, :n], p[:n]) for i, (a, b, c, p) in self.hist.items()}
        self.qhist = {i: (kq[:, :, :n], vq[:, :, :n]) for i, (kq, vq) in self.qhist.items()}
        self._masks_for, self._masks = None, {}

    def attend(self, layer: int, q: Tensor, k_pre: Tensor, k: Tensor, v: Tensor, positions: Tensor, model) -> Tensor:
        space = None
        eng = self.scheme.engine
        if eng is not None and layer not in eng.boundary_layers(self.n_layers):
            # an engine profile: attend in the engine's space (history kept there)
            space = engine_space(eng, q.shape[-1], model.config.gguf_qk_permuted, str(q.device))
            q, k_pre, k, v = space.queries(q), space.keys(k_pre), space.keys(k), space.values(v)
        if layer in self.hist:
            hk_pre, hk, hv, hpos = self.hist[layer]
            k_pre, k, v = (torch.cat([a, b], dim=2) for a, b in ((hk_pre, k_pre), (hk, k), (hv, v)))
            k_pos = torch.cat([hpos, positions])
        else:
            k_pos = positions
        self.hist[layer] = (k_pre, k, v, k_pos)
        k_spec, v_spec = self.scheme.for_layer(layer, self.n_layers)
        cal = self.calib.get(layer, {})
        pk, pv = self.qhist.get(layer, (None, None))
        kc, vc = (space.codec("k"), space.codec("v")) if space is not None else (None, None)
        groups = self.scheme.head_groups(layer, self.n_layers, k.shape[1])
        if len(groups) > 1:  # per-head specs (no calibrated state, no prerope): each group of heads as its pair
            kq, vq, k_spec, v_spec = head_histories(k, v, groups, self.scheme, pk, pv)
        else:
            kq = quantized_history(k_pre if k_spec.pre_rope else k, k_spec, self.scheme, cal.get("k"), pk, kc)
            vq = quantized_history(v, v_spec, self.scheme, cal.get("v"), pv, vc)
        self.qhist[layer] = (kq, vq)
        if k_spec.pre_rope:
            kq = model.apply_rope(kq, k_pos, max_position=model.rope_positions - 1)  # earlier positions: covered
        if self._masks_for is not positions:  # a new forward: the layers of one forward share their masks
            self._masks_for, self._masks = positions, {}
        out = faithful_attention(q, k, v, kq, vq, positions, k_pos, k_spec, v_spec, self.policy, self.q_chunk,
                                 mask_cache=self._masks, sliding_window=getattr(model.config, "sliding_window", None))
        return out if space is None else space.output(out)


def faithful_attention(q, k, v, kq, vq, q_pos, k_pos, k_spec, v_spec, policy: FpPolicy,
                       q_chunk: int = 2048, mask_cache: dict | None = None,
                       sliding_window: int | None = None) -> Tensor:
    """Causal GQA attention where each (query, key) pair reads the full-precision or quantized copy.

    q [B, Hq, T, D]; k, v, kq, vq [B, Hk, S, D]; q_pos [T], k_pos [S]. Returns [B, Hq, T, D] in q.dtype.
    Each (K copy, V copy) combination that some pair uses becomes one block of keys in a single
    SDPA call whose boolean mask gives every pair exactly one block; when every pair reads the
    same copy (no window, sink or unfinished channel group; or float storage) a prefill is one
    causal SDPA over that copy. mask_cache: a dict kept by the caller for calls that share q_pos
    and k_pos (the layers of one forward); each chunk's mask (up to MASK_CACHE_MAX elements) is
    built once and reused from it. Its key holds shapes, not values: one dict must never serve
    calls with different positions of the same shapes (DecodeFaithfulBackend keeps one per forward).
    sliding_window: None, or this layer's attention window W: query i reads key j only if i - W < j
    (Mistral; Gemma 3's sliding layers, whose per-layer view passes the layer's window).
    """
    B, Hq, T, D = q.shape
    # the same tensor (a fresh backend's prefill) needs no comparison, which would sync the device
    prefill = T == k.shape[2] and (q_pos is k_pos or torch.equal(q_pos, k_pos))
    one = _one_copy(k_spec, v_spec, policy)
    if prefill and one is not None and sliding_window is None and B * Hq * T * T <= MAX_SCORES:
        kk, vv = (k if one[0] else kq), (v if one[1] else vq)
        return _sdpa(q.float(), kk.float(), vv.float(), causal=True).to(q.dtype)
    out = torch.empty(B, Hq, T, D, dtype=torch.float32, device=q.device)
    order = copy_blocks(k_spec, v_spec, policy)  # decided on the host: asking the masks would sync the device
    copies = {(0, 0): (kq, vq), (1, 1): (k, v), (0, 1): (kq, v), (1, 0): (k, vq)}
    kc = torch.cat([copies[b][0].float() for b in order], dim=2)                # [B, Hk, nS, D]
    vc = torch.cat([copies[b][1].float() for b in order], dim=2)
    rows = max(1, MAX_SCORES // (B * Hq * kc.shape[2]))  # float32 SDPA runs its math kernel: bound its scores
    for i in range(0, T, q_chunk):
        qc, pc = q[:, :, i:i + q_chunk].float(), q_pos[i:i + q_chunk]
        key = (i, q_chunk, k_pos.shape[0], order, k_spec.is_float_storage, v_spec.is_float_storage, sliding_window)
        mask = None if mask_cache is None else mask_cache.get(key)
        if mask is None:
            causal = k_pos[None, :] <= pc[:, None]                               # [t, S]
            if sliding_window is not None:
                causal &= k_pos[None, :] > pc[:, None] - sliding_window
            fk, fv = fp_mask(k_spec, policy, pc, k_pos) & causal, fp_mask(v_spec, policy, pc, k_pos) & causal
            part = {(0, 0): lambda: causal & ~fk & ~fv, (1, 1): lambda: fk & fv, (0, 1): lambda: ~fk & fv,
                    (1, 0): lambda: fk & ~fv}
            mask = torch.cat([part[b]() for b in order], dim=1)                  # [t, nS]
            if mask_cache is not None and mask.numel() <= MASK_CACHE_MAX:  # decode steps, short passes
                mask_cache[key] = mask
        for j in range(0, qc.shape[2], rows):
            r = min(rows, qc.shape[2] - j)
            out[:, :, i + j:i + j + r] = _sdpa(qc[:, :, j:j + r], kc, vc, mask=mask[j:j + r])
    return out.to(q.dtype)


def copy_blocks(k_spec: KVQuantSpec, v_spec: KVQuantSpec, policy: FpPolicy) -> tuple[tuple[int, int], ...]:
    """(K copy, V copy) pairs, 1 = full precision, that some (query, key) pair may read, in a fixed order.

    K and V share one policy, so a quantized K and a quantized V are read in full precision at the
    same pairs: mixed pairs occur only when one side is float storage (always full precision)."""
    fk_always, fv_always = k_spec.is_float_storage, v_spec.is_float_storage
    some_fp = bool(policy.sink or policy.window or policy.group > 1)
    ks = (1,) if fk_always else ((0, 1) if some_fp else (0,))
    vs = (1,) if fv_always else ((0, 1) if some_fp else (0,))
    return tuple(b for b in ((0, 0), (1, 1), (0, 1), (1, 0))
                 if b[0] in ks and b[1] in vs and (fk_always or fv_always or b[0] == b[1]))


def _one_copy(k_spec: KVQuantSpec, v_spec: KVQuantSpec, policy: FpPolicy) -> tuple[bool, bool] | None:
    """(K full precision?, V full precision?) when every (query, key) pair reads the same copies,
    else None."""
    if k_spec.is_float_storage and v_spec.is_float_storage:
        return True, True
    if policy.sink == 0 and policy.window == 0 and policy.group == 1:
        return k_spec.is_float_storage, v_spec.is_float_storage
    return None


def _sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False) -> Tensor:
    """SDPA over q [B, Hq, T, D] and GQA k, v [B, Hk, S, D]. On CUDA the KV heads are expanded
    (enable_gqa with a mask is math-kernel-only). Float32 still runs the math kernel (torch 2.11),
    which materializes [B, Hq, T, S]: callers bound T * S by MAX_SCORES."""
    gqa = q.shape[1] != k.shape[1]
    if gqa and q.is_cuda:
        r = q.shape[1] // k.shape[1]
        k, v, gqa = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1), False
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=gqa)


def needs_calibration(spec: KVQuantSpec) -> bool:
    """True when the spec needs a per-tensor value calibrated on other text: a static scale, NVFP4's second level,
    a calibrated codebook's levels, key smoothing factors or a key channel permutation."""
    return spec.needs_tensor_scale or spec.calibrated or spec.smooth or spec.permute


PERM_OFFSETS = 4  # captures of the calibration text, at positions spread over the model's context, for `perm`


def _spread_capture(model, tokens: Tensor) -> dict:
    """The calibration tokens captured at PERM_OFFSETS start positions spread over the model's context (one batch
    row each): post-RoPE keys and queries whose channel statistics cover the positions a long context reaches."""
    T = tokens.shape[1]
    ctx = int(getattr(model.config, "max_position_embeddings", T))
    starts = [0] if ctx <= T else [round(i * (ctx - T) / (PERM_OFFSETS - 1)) for i in range(PERM_OFFSETS)]
    caps = [model.capture(tokens, positions=torch.arange(T, device=tokens.device) + s0) for s0 in starts]
    return {key: [torch.cat([c[key][i] for c in caps]) for i in range(len(caps[0][key]))] for key in ("k", "q")}


@torch.no_grad()
def calibrate(model, tokens: Tensor, scheme, smooth_search: bool = False) -> dict:
    """Static per-tensor scales, calibrated codebooks, key smoothing factors and key channel permutations per layer
    from a calibration pass (a different text than scored).

    Returns {layer: {"k": kwargs, "v": kwargs}} for `quantize` (tensor_scale=, scale=, codebook=, smooth=). Smoothing
    factors come first (`fit_smoothing` on the layer's keys and queries past the scheme's sinks, [Hk, 1, D], tied
    within RoPE pairs for `smooth=pair`; strength
    0.5, or with `smooth_search` the per-head strength whose quantized keys give the least score error); the
    other values are then fitted to the smoothed keys k / s (the queries they meet are q * s). A `perm` K spec's
    channel order comes next (`fit_permutation`, [Hk, 1, D]) from the calibration text captured again at positions
    spread over the model's context (RoPE moves key energy between channels with position; the order fitted at the
    text's own positions loses its gain at 7K on SmolLM2, sweeps/results/quality/permutations/), smoothed alike;
    codebooks and static scales are then those of the permuted keys. A calibrated key
    codebook weights each element by the mean square of the query channel it meets (GQA: over the KV head's query
    heads; in the rotated domain when the spec rotates), so the fit minimises the error of the scores; value
    codebooks weigh elements alike."""
    from ..quant.permutation import fit_permutation, permute_channels, permute_queries
    from ..quant.smoothing import fit_smoothing, smooth_keys, smooth_queries
    sch = as_scheme(scheme)
    n = model.config.n_layers
    specs = [sch.for_layer(i, n) for i in range(n)]
    if not any(needs_calibration(s) for pair in specs for s in pair):
        return {}
    cap = model.capture(tokens)
    spread = _spread_capture(model, tokens) if any(ks.permute for ks, _ in specs) else None
    out = {}
    for i, (ks, vs) in enumerate(specs):
        out[i] = {}
        q = cap["q"][i]
        for name, spec, x in (("k", ks, cap["k_pre"][i] if ks.pre_rope else cap["k"][i]), ("v", vs, cap["v"][i])):
            if not needs_calibration(spec):
                continue
            kw = {}
            if spec.smooth:  # per channel (or RoPE pair) of the post-RoPE keys, per layer and KV head
                s = fit_smoothing(x, q, sink=min(sch.sink, x.shape[2] - 1), spec=spec if smooth_search else None,
                                  pairs=spec.smooth_pairs)
                kw["smooth"] = s[:, None, :]
                x, q = smooth_keys(x.float(), s, heads_dim=-3), smooth_queries(q.float().transpose(1, 2), s)
                q = q.transpose(1, 2)
                spec = dataclasses.replace(spec, smooth=False, smooth_pairs=False)
            if spec.permute:  # the channel order of the (smoothed) keys, fitted over spread positions
                ksp, qsp = spread["k"][i].float(), spread["q"][i].float()
                if "smooth" in kw:
                    ksp = smooth_keys(ksp, kw["smooth"][:, 0], heads_dim=-3)
                    qsp = smooth_queries(qsp.transpose(1, 2), kw["smooth"][:, 0]).transpose(1, 2)
                p = fit_permutation(ksp, qsp, spec, sink=min(sch.sink, x.shape[2] - 1))
                kw["perm"] = p[:, None, :]
                x = permute_channels(x.float(), p, heads_dim=-3)
                q = permute_queries(q.float().transpose(1, 2), p).transpose(1, 2)
                spec = dataclasses.replace(spec, permute=False)
            if spec.calibrated:
                kw["codebook"] = fit_codebook(x.contiguous(), spec, _query_weights(q, x, spec) if name == "k" else None)
            elif spec.needs_tensor_scale:
                qt = quantize(x.contiguous(), spec)
                kw.update({"tensor_scale": qt.tensor_scale} if spec.tensor_scale else {"scale": qt.scales.float()})
            out[i][name] = kw
    return out


def _query_weights(q: Tensor, k: Tensor, spec: KVQuantSpec) -> Tensor:
    """[1, Hk, 1, D] mean square of each query channel over tokens and the KV head's query heads (rotated as the
    spec rotates keys: scores are invariant, (q H)(k H)^T = q k^T). q [B, Hq, T, D], k [B, Hk, T, D]."""
    from ..quant import rotate
    B, Hq, T, D = q.shape
    Hk = k.shape[1]
    qf = rotate(q.float()) if spec.rotation == "had" else q.float()
    return qf.reshape(B, Hk, Hq // Hk, T, D).pow(2).mean((0, 2, 3))[None, :, None, :]
