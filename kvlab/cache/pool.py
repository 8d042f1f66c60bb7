"""`KVPool`: a paged, quantized KV cache for L layers with a full-precision window.

    pool = KVPool("kivi4", n_layers=30, n_kv_heads=3, head_dim=64, n_pages=4096, page_size=32)
    s = pool.add_sequence()
    for layer in range(30):
        pool.append(s, layer, k, v)                 # k, v [T, Hk, D]: prefill or decode (T = 1)
    bt = pool.block_table([s], layer=0)             # CSR over quantized pages (FlashInfer style)
    fp = pool.fp_buffer(0, [s])                     # full-precision tokens [B, Hk, W, D] + lengths
    k, v = pool.dense_kv(s, 0)                      # float32 [Hk, T, D] in position order (reference)

All layers share one page id space and one block table per sequence (as vLLM); each layer has
its own page tensors (`PageLayout` of its K and V spec). Which tokens stay full precision is
`kvlab.cache.window` (sinks, recent window, unfinished channel group). Tokens leaving the fp
buffer are quantized into pages by the pool's store function: by default the torch oracle
(`paging.write_tokens`); a caller passes a faster one (the store op's `pool_store`, a Triton kernel);
this package never imports the layers above it. Keys are stored as given: post-RoPE, or pre-RoPE when
the K spec says `prerope` (the attention side then applies RoPE at positions `sink + i` for page
tokens and `positions` of the fp buffer). Inputs are cast to the fp dtype on entry, so a token
is quantized from the same values whether it went through the window or straight to pages.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .block_table import slots_of
from .capacity import pages_that_fit
from .head_parts import build_parts
from .paging import calibrate, codebook_table, write_tokens
from .pool_views import PoolViews
from .window import FpPolicy, plan_append

def reference_store(x, pages, slots, spec, page_size, scale, tensor_scale) -> None:
    """The default store function: quantize x [T, Hk, D] with the oracle and write it at slots [T]."""
    write_tokens(x, pages, slots, spec, page_size, scale=scale, tensor_scale=tensor_scale)


@dataclass
class _Seq:
    row: int
    n_layers: int
    pages: list = field(default_factory=list)
    n: list = field(default_factory=list)
    rows: list = field(default_factory=list)

    def __post_init__(self):
        self.n = [0] * self.n_layers
        self.rows = [[] for _ in range(self.n_layers)]


class KVPool(PoolViews):
    """Paged KV cache: N pages of P tokens, L layers, Hk heads of head_dim D (see module doc).

    scheme: KVScheme or text; fp_dtype: dtype of full-precision tokens (default bf16 on CUDA,
    float32 on CPU); max_seqs: live sequences at once (rows of the fp buffer);
    store: fn(x [T, Hk, D], pages, slots [T] int64, spec, page_size, scale, tensor_scale) that quantizes
    tokens into pages (default `reference_store`, the oracle; the store op's `pool_store` runs the Triton kernel).

    Per-head specs (`L<i>.h<j>=`): a mixed layer keeps one set of pages per group of KV heads (`parts[layer]`,
    `kvlab.cache.head_parts`); attention reads it through `layer_parts`.
    """

    def __init__(self, scheme, n_layers: int, n_kv_heads: int, head_dim: int, n_pages: int, page_size: int = 16, *,
                 max_seqs: int = 64, device="cpu", fp_dtype: torch.dtype | None = None, store=None):
        from ..spec import as_scheme
        for name, v in (("n_layers", n_layers), ("n_kv_heads", n_kv_heads), ("head_dim", head_dim),
                        ("n_pages", n_pages), ("page_size", page_size), ("max_seqs", max_seqs)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        self.scheme = as_scheme(scheme)
        eng = self.scheme.engine
        if eng is not None and (eng.rotate or eng.k_codec or eng.v_codec or eng.q_round or eng.gguf_k_order):
            raise ValueError(f"engine profile {eng.name} models arithmetic the pool does not run (rotation, channel "
                             "order, query rounding or the engine's own quantizer; kvlab.eval evaluates it); pool its "
                             f"stored blocks as a plain scheme: k={eng.k_spec},v={eng.v_spec}")
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.n_pages, self.page_size, self.max_seqs = n_pages, page_size, max_seqs
        self.device = torch.empty(0, device=device).device
        self.fp_dtype = fp_dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.policy = FpPolicy.of(self.scheme, n_layers)
        self.specs = [self.scheme.for_layer(i, n_layers) for i in range(n_layers)]
        for i, pair in enumerate(self.scheme.pairs(n_layers)):
            for s in pair:
                if s.axis == "tensor" and not (s.is_float_storage or s.fmt == "int" or s.fmt.startswith("fp8")):
                    raise ValueError(f"spec {s}: axis tensor with {s.fmt} is not supported by the pool (no static "
                                     "codebook scale); use axis tok, head or chan")
        # one part per group of KV heads sharing a spec pair (`head_parts`); a mixed layer (per-head specs) has no
        # layer-wide page dicts or layouts: k_pages / v_pages / layouts[layer] are None there, its parts hold them
        self.parts = [build_parts(self.scheme.head_groups(i, n_layers, n_kv_heads), head_dim, page_size, n_pages,
                                  self.device) for i in range(n_layers)]
        whole = [len(p) == 1 for p in self.parts]
        self.layouts = [(p[0].k_layout, p[0].v_layout) if w else None for p, w in zip(self.parts, whole)]
        self.k_pages = [p[0].k_pages if w else None for p, w in zip(self.parts, whole)]
        self.v_pages = [p[0].v_pages if w else None for p, w in zip(self.parts, whole)]
        W = self.policy.capacity
        shape = (max_seqs, n_kv_heads, W, head_dim)
        self.k_fp = [torch.zeros(shape, dtype=self.fp_dtype, device=self.device) for _ in range(n_layers)]
        self.v_fp = [torch.zeros(shape, dtype=self.fp_dtype, device=self.device) for _ in range(n_layers)]
        self._static = [{"k": None, "v": None, "k_ts": None, "v_ts": None, "k_cb": False, "v_cb": False,
                         "k_sm": False, "set": False} for _ in range(n_layers)]
        self._free = list(range(n_pages))[::-1]
        self._free_rows = list(range(max_seqs))[::-1]
        self._seqs: dict[int, _Seq] = {}
        self._next_id = 0
        if store is not None and not callable(store):
            raise ValueError(f"store must be a function (x, pages, slots, spec, page_size, scale, tensor_scale) or "
                             f"None for the oracle, got {type(store).__name__}")
        self._store_fn = store or reference_store

    @classmethod
    def from_memory(cls, gib: float, scheme, n_layers: int, n_kv_heads: int, head_dim: int, page_size: int = 16,
                    **kw) -> "KVPool":
        """A pool using at most `gib` GiB (pages + fp buffers of max_seqs sequences + static scales)."""
        from ..spec import as_scheme
        dev = torch.empty(0, device=kw.get("device", "cpu")).device
        fp = kw.get("fp_dtype") or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
        n = pages_that_fit(gib, as_scheme(scheme), n_layers, n_kv_heads, head_dim, page_size,
                           n_seqs=kw.get("max_seqs", 64), fp_bytes=torch.empty(0, dtype=fp).element_size())
        if n < 1:
            raise ValueError(f"{gib} GiB does not hold one page plus the fp buffers; lower max_seqs or raise gib")
        return cls(scheme, n_layers, n_kv_heads, head_dim, n, page_size, **kw)

    # ---- sequences ----------------------------------------------------------------------
    def add_sequence(self, row: int | None = None) -> int:
        """A new empty sequence; returns its id. row: the fp-buffer row it must use (a batch slot of
        `kvlab.cache.step.DecodeStep`, whose kernels read row b for slot b); default: any free row."""
        if not self._free_rows:
            raise ValueError(f"max_seqs={self.max_seqs} sequences are live; free one or build the pool with more")
        if row is not None and row not in self._free_rows:
            raise ValueError(f"fp row {row!r} is not free; free rows: {sorted(self._free_rows)[:16]} "
                             f"(rows 0..{self.max_seqs - 1})")
        r = self._free_rows.pop() if row is None else row
        if row is not None:
            self._free_rows.remove(row)
        sid, self._next_id = self._next_id, self._next_id + 1
        self._seqs[sid] = _Seq(r, self.n_layers)
        return sid

    def free(self, seq_id: int) -> None:
        """Release a sequence's pages and fp rows (they are reusable at once)."""
        st = self._seq(seq_id)
        self._free.extend(reversed(st.pages))
        self._free_rows.append(st.row)
        del self._seqs[seq_id]

    def _seq(self, seq_id) -> _Seq:
        if seq_id not in self._seqs:
            raise ValueError(f"unknown sequence id {seq_id!r}; live ids: {sorted(self._seqs)[:16]}")
        return self._seqs[seq_id]

    def _layer(self, layer) -> int:
        if not isinstance(layer, int) or not 0 <= layer < self.n_layers:
            raise ValueError(f"layer must be an int in [0, {self.n_layers}), got {layer!r}")
        return layer

    @property
    def seq_ids(self) -> list[int]:
        return sorted(self._seqs)

    @property
    def n_free_pages(self) -> int:
        return len(self._free)

    def pages_of(self, seq_id: int) -> list[int]:
        return list(self._seq(seq_id).pages)

    def seq_len(self, seq_id: int, layer: int = 0) -> int:
        return self._seq(seq_id).n[self._layer(layer)]

    def n_quantized(self, seq_id: int, layer: int = 0) -> int:
        return self.policy.n_quantized(self.seq_len(seq_id, layer))

    # ---- static scales ------------------------------------------------------------------
    def set_static_scales(self, layer: int, *, k_scale=None, v_scale=None, k_tensor_scale=None,
                          v_tensor_scale=None, k_codebook=None, v_codebook=None, k_smooth=None,
                          k_perm=None) -> None:
        """Fix a layer's static scales (axis-tensor `scale`, NVFP4 `tensor_scale`), calibrated codebook levels
        (`cal` specs: float [2^bits], e.g. from `kvlab.quant.fit_codebook` on calibration text) and key smoothing
        factors (`smooth` K specs: float [Hk, D], from `kvlab.quant.fit_smoothing` on calibration keys and queries)
        and key channel permutations (`perm` K specs: int [Hk, D], from `kvlab.quant.fit_permutation`) before its
        first append; unset ones are calibrated from the first tokens appended to the layer (codebooks
        unweighted; smoothing factors and permutations need the queries, so unset ones stay 1 and the identity).
        Static scales and codebooks given here are those of the stored (smoothed, permuted) keys."""
        from ..quant.oracle import check_codebook
        from ..quant.permutation import check_permutation
        from ..quant.smoothing import check_smoothing
        st = self._static[self._layer(layer)]
        if st["set"]:
            raise ValueError(f"layer {layer} already holds tokens; static scales are fixed before the first append")
        kspec, vspec = self.specs[layer]
        for key, val, spec, idx in (("k", k_scale, kspec, 0), ("v", v_scale, vspec, 0),
                                    ("k_ts", k_tensor_scale, kspec, 1), ("v_ts", v_tensor_scale, vspec, 1)):
            if val is None:
                continue
            if not (spec.static_scale, spec.tensor_scale)[idx]:
                raise ValueError(f"layer {layer} {key[0].upper()} spec {spec} takes no {'tensor_' * idx}scale")
            st[key] = torch.as_tensor(val, dtype=torch.float32).reshape(()).to(self.device)
        for key, val, spec, pages in (("k_cb", k_codebook, kspec, self.k_pages[layer]),
                                      ("v_cb", v_codebook, vspec, self.v_pages[layer])):
            if val is None:
                continue
            if not spec.calibrated:
                raise ValueError(f"layer {layer} {key[0].upper()} spec {spec} takes no codebook (not calibrated)")
            pages["codebook"].copy_(codebook_table(check_codebook(val, spec)).to(self.device))
            st[key] = True
        if k_smooth is not None:
            if not kspec.smooth:
                raise ValueError(f"layer {layer} K spec {kspec} takes no smoothing factors (add ':smooth')")
            self.k_pages[layer]["smooth"].copy_(check_smoothing(k_smooth, self.n_kv_heads, self.head_dim,
                                                                "k_smooth").to(self.device))
            st["k_sm"] = True
        if k_perm is not None:
            if not kspec.permute:
                raise ValueError(f"layer {layer} K spec {kspec} takes no channel permutation (add ':perm')")
            self.k_pages[layer]["perm"].copy_(check_permutation(k_perm, self.n_kv_heads, self.head_dim,
                                                                "k_perm").to(self.device))

    def calibrate_from(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Fix a layer's unset static scales and calibrated codebooks from k, v [T, Hk, D], exactly as its first append
        would from the same tokens (taken in fp_dtype); nothing when they are set. A prefill that attends before it
        appends (the chunk's own attention needs NVFP4's tensor scale) calls this first."""
        layer = self._layer(layer)
        if not self._static[layer]["set"]:
            self._calibrate(layer, k.detach().to(self.fp_dtype), v.detach().to(self.fp_dtype))

    def _calibrate(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        st = self._static[layer]
        if self.specs[layer][0].smooth:
            if not st["k_sm"]:  # the factors need the queries, which a pool never sees: none given, none applied
                self.k_pages[layer]["smooth"].fill_(1.0)
                st["k_sm"] = True
            k = self.stored_keys(layer, k)
        for key, x, spec in (("k", k, self.specs[layer][0]), ("v", v, self.specs[layer][1])):
            scale, ts = calibrate(x, spec)
            st[key] = st[key] if st[key] is not None else scale
            st[key + "_ts"] = st[key + "_ts"] if st[key + "_ts"] is not None else ts
            if spec.calibrated and not st[key + "_cb"]:
                from ..quant import fit_codebook
                xs = x.transpose(0, 1).float()                      # [Hk, T, D]
                if spec.axis == "chan":
                    xs = xs[:, :xs.shape[1] // spec.group * spec.group]
                pages = (self.k_pages if key == "k" else self.v_pages)[layer]
                pages["codebook"].copy_(codebook_table(fit_codebook(xs, spec)))
                st[key + "_cb"] = True
        st["set"] = True

    def stored_keys(self, layer: int, k: torch.Tensor) -> torch.Tensor:
        """Keys k [..., Hk, D] as the layer stores them: divided by its smoothing factors (in k's dtype) for a
        `smooth` K spec, then in its channel order for a `perm` one, else k itself."""
        kspec = self.specs[layer][0]
        if kspec.smooth:
            from ..quant.smoothing import smooth_keys
            k = smooth_keys(k, self.k_pages[layer]["smooth"])
        if kspec.permute:
            from ..quant.permutation import permute_channels
            k = permute_channels(k, self.k_pages[layer]["perm"])
        return k

    # ---- appending ----------------------------------------------------------------------
    def _check_kv(self, name: str, t, T: int | None = None) -> None:
        if not isinstance(t, torch.Tensor) or t.dim() != 3 or tuple(t.shape[1:]) != (self.n_kv_heads, self.head_dim):
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a tensor [T, {self.n_kv_heads}, {self.head_dim}] (tokens, KV heads, "
                             f"head_dim), got {got}")
        if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"{name} dtype {t.dtype}; allowed: float32, float16, bfloat16")
        if t.device != self.device:
            raise ValueError(f"{name} is on {t.device}; the pool is on {self.device}")
        if T is not None and t.shape[0] != T:
            raise ValueError(f"k has {T} tokens but {name} has {t.shape[0]}")

    def append(self, seq_id: int, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Append new tokens k, v [T, Hk, D] (float32/16/bf16, keys post-RoPE unless the K spec is
        prerope) to `layer` of a sequence: prefill (T in the thousands) or decode (T = 1).
        Tokens that leave the full-precision window are quantized into pages now."""
        self._append([(seq_id, k, v)], layer)

    def append_batch(self, seq_ids, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Decode step: one new token per sequence, k, v [B, Hk, D]; one store launch for the batch."""
        self._check_kv("k", k)
        if len(seq_ids) != k.shape[0]:
            raise ValueError(f"{len(seq_ids)} sequence ids for {k.shape[0]} tokens")
        self._check_kv("v", v, k.shape[0])
        self._append([(s, k[b:b + 1], v[b:b + 1]) for b, s in enumerate(seq_ids)], layer)

    def _append(self, items, layer: int) -> None:
        layer = self._layer(layer)
        if len({s for s, _, _ in items}) != len(items):
            raise ValueError("a sequence id appears twice in one batch")
        for s, k, v in items:  # validate everything before touching any state
            self._seq(s)
            self._check_kv("k", k)
            self._check_kv("v", v, k.shape[0])
        # detach: the cache holds values; an input that requires grad must not chain the pool's
        # buffers into its autograd graph (which would grow, and be kept alive, with every append)
        items = [(s, k.detach().to(self.fp_dtype), v.detach().to(self.fp_dtype)) for s, k, v in items if k.shape[0]]
        if not items:
            return
        P = self.page_size
        plans = [plan_append(self.policy, self._seqs[s].rows[layer], self._seqs[s].n[layer], k.shape[0])
                 for s, k, _ in items]
        need = [max(0, -(-p.q_range[1] // P) - len(self._seqs[s].pages)) for (s, _, _), p in zip(items, plans)]
        if sum(need) > len(self._free):
            raise ValueError(f"out of pages: this append needs {sum(need)} more pages of {P} tokens, "
                             f"{len(self._free)} of {self.n_pages} are free; free sequences or build a larger pool")
        if not self._static[layer]["set"]:  # (checked first: the concatenation is skipped once set)
            self.calibrate_from(layer, torch.cat([k for _, k, _ in items]), torch.cat([v for _, _, v in items]))
        if self.specs[layer][0].smooth or self.specs[layer][0].permute:  # pages and the fp buffer hold k / s in
            # the layer's channel order; attention multiplies q by s and reads it in that order
            items = [(s, self.stored_keys(layer, k), v) for s, k, v in items]
        for (s, _, _), n in zip(items, need):
            self._seqs[s].pages.extend(self._free.pop() for _ in range(n))
        kf, vf = self.k_fp[layer], self.v_fp[layer]
        xs_k, xs_v, slots, moves, writes, new_k, new_v = [], [], [], [], [], [], []
        for (s, k, v), p in zip(items, plans):
            st = self._seqs[s]
            if p.q_range[1] > p.q_range[0]:
                old = torch.tensor(p.quant_rows, dtype=torch.long, device=self.device)
                a, b = p.quant_new
                xs_k += [kf[st.row][:, old].transpose(0, 1), k[a:b]]  # [Tq, Hk, D] in position order
                xs_v += [vf[st.row][:, old].transpose(0, 1), v[a:b]]
                slots += slots_of(st.pages, *p.q_range, P)
            moves += [(st.row, src, dst) for src, dst in p.moves]
            writes += [(st.row, dst) for _, dst in p.writes]
            idx = torch.tensor([i for i, _ in p.writes], dtype=torch.long, device=self.device)
            new_k.append(k[idx])
            new_v.append(v[idx])
        if slots:
            sl = torch.tensor(slots, dtype=torch.int64, device=self.device)
            st_ = self._static[layer]
            xk, xv = torch.cat(xs_k), torch.cat(xs_v)  # [Tq, Hk, D]
            for part in self.parts[layer]:
                for x, key in ((xk, "k"), (xv, "v")):
                    spec, pages = part.side(key)
                    self._store_fn(part.take(x, 1), pages, sl, spec, P, st_[key], st_[key + "_ts"])
        if moves:
            r, src, dst = (torch.tensor(c, dtype=torch.long, device=self.device) for c in zip(*moves))
            for buf in (kf, vf):
                buf[r, :, dst] = buf[r, :, src].clone()
        if writes:
            r, dst = (torch.tensor(c, dtype=torch.long, device=self.device) for c in zip(*writes))
            kf[r, :, dst] = torch.cat(new_k)
            vf[r, :, dst] = torch.cat(new_v)
        for (s, k, _), p in zip(items, plans):
            self._seqs[s].n[layer] += k.shape[0]
            self._seqs[s].rows[layer] = p.rows
