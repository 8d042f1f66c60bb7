"""Decode steps at fixed shapes: one new token per batch slot, planned once on the host for every layer and
written on the device with index tensors only, so that a whole decode step (store, full-precision window,
block table, attention) can be captured in a CUDA graph and replayed, as serving engines' decode graphs are.

    step = DecodeStep(pool, slots=64, max_tokens=8192)
    step.plan({0: seq_a, 3: seq_b})          # host: pages taken, every layer's counts advanced, buffers filled
    for layer in range(L):                   # device only (no host sync, fixed shapes): capturable
        step.write(layer, k, v)              # k, v [slots, Hk, D]: the new token of each slot
        decode(q, *step.attention_args(layer)[0], **step.attention_args(layer)[1])

Slot b holds one sequence in the pool's fp-buffer row b (`KVPool.add_sequence(row=b)`), or nothing. Appending
one token to a sequence (`window.plan_append`) moves at most M tokens into pages (M = Gc, the channel-group
lcm; 1 without channel axes): old fp rows and perhaps the new token itself; it compacts at most M - 1 fp rows
and writes the new token to one row. Every slot gets M entries of each kind; unused entries are no-ops:
slot -1 (the store skips it), a move of row W-1 onto itself, a write of a row's own value. No-op moves and
writes cannot collide with real ones: real moves fill holes below the buffer's last used row (so never W-1),
and the new-token write comes after the moves.

All host-side state changes (pages, counts, rows) happen in `plan`; `write` only moves bytes. Steps must be
written for every layer before the next `plan` (the counts say they were).
"""
from __future__ import annotations

import numpy as np
import torch

from .window import plan_append

_FIELDS = ("q_col", "q_new", "q_slot", "mv_src", "mv_dst")  # [B, M] each
_ROWS = ("w_col", "w_has", "fp_len", "positions", "kv_last_page_len")  # [B] each


class DecodeStep:
    """Static buffers of one decode step of `slots` batch slots over `pool` (see module doc).

    max_tokens: the longest sequence a slot may reach (sizes the block table: slots x ceil(max_tokens / P)
    page ids). Device tensors (int32) that stay at one address for the object's life: `positions` [B],
    `fp_len` [B], `kv_indptr` [B+1], `kv_indices` [B * max_pages], `kv_last_page_len` [B]."""

    def __init__(self, pool, slots: int, max_tokens: int) -> None:
        if not isinstance(slots, int) or not 1 <= slots <= pool.max_seqs:
            raise ValueError(f"slots must be an int in [1, max_seqs={pool.max_seqs}], got {slots!r}")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
        self.pool, self.B = pool, slots
        self.P, self.W = pool.page_size, pool.policy.capacity
        self.M = pool.policy.group
        self.max_pages = -(-max_tokens // self.P)
        B, M = self.B, self.M
        sizes = [B * M] * len(_FIELDS) + [B] * len(_ROWS) + [B + 1, B * self.max_pages]
        self._offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        n = int(self._offsets[-1])
        dev = pool.device
        self.buf = torch.zeros(n, dtype=torch.int32, device=dev)
        cuda = dev.type == "cuda"
        self._host = [torch.zeros(n, dtype=torch.int32, pin_memory=cuda) for _ in range(2 if cuda else 1)]
        self._events: list = [None] * len(self._host)
        self._turn = 0
        views = {}
        for i, name in enumerate(_FIELDS):
            views[name] = self._view(i).view(B, M)
        for j, name in enumerate(_ROWS):
            views[name] = self._view(len(_FIELDS) + j)
        views["kv_indptr"] = self._view(len(_FIELDS) + len(_ROWS))
        views["kv_indices"] = self._view(len(_FIELDS) + len(_ROWS) + 1)
        self.__dict__.update(views)
        self._rows = torch.arange(B, device=dev)  # slot b is fp row b
        self._pages = np.zeros((B, self.max_pages), dtype=np.int32)  # page ids of each slot, as known
        self._known = [0] * B
        self._seq_of: list = [None] * B
        self.slot_seqs: dict[int, int] = {}

    def _view(self, i: int) -> torch.Tensor:
        return self.buf[int(self._offsets[i]):int(self._offsets[i + 1])]

    # ---- host ---------------------------------------------------------------------------------
    def plan(self, slot_seqs: dict[int, int]) -> None:
        """Plan appending one token to each sequence of `slot_seqs` {slot: seq_id} (other slots idle), for
        every layer: takes the pages needed, advances each sequence's counts, and fills the device buffers
        (one host-to-device copy). Raises ValueError, changing nothing, on a bad slot, a sequence not in row
        `slot`, layers out of step, a sequence past max_tokens, or too few free pages."""
        pool, P, B, M, W = self.pool, self.P, self.B, self.M, self.W
        L = pool.n_layers
        work = []
        for b, s in sorted(slot_seqs.items()):
            if not isinstance(b, int) or not 0 <= b < B:
                raise ValueError(f"slot {b!r} is not in [0, {B})")
            st = pool._seq(s)
            if st.row != b:
                raise ValueError(f"sequence {s} sits in fp row {st.row}, not in its slot {b}: add it with "
                                 f"pool.add_sequence(row={b})")
            n = st.n[0]
            if st.n.count(n) != L:
                raise ValueError(f"sequence {s}: layers hold different token counts {sorted(set(st.n))}; finish the "
                                 "last step or prefill on every layer first")
            if -(-pool.policy.n_quantized(n + 1) // P) > self.max_pages:
                raise ValueError(f"sequence {s} would exceed max_tokens={self.max_pages * P} of this DecodeStep")
            p = plan_append(pool.policy, st.rows[0], n, 1)
            work.append((b, s, st, n, p, max(0, -(-p.q_range[1] // P) - len(st.pages))))
        need = sum(w[5] for w in work)
        if need > len(pool._free):
            raise ValueError(f"out of pages: this step needs {need} more pages of {P} tokens, {len(pool._free)} of "
                             f"{pool.n_pages} are free; free sequences or build a larger pool")
        h = self._host[self._turn]
        if self._events[self._turn] is not None:
            self._events[self._turn].synchronize()  # its last copy has been read
        a = h.numpy()
        f = {name: a[self._offsets[i]:self._offsets[i + 1]] for i, name in enumerate(_FIELDS + _ROWS)}
        for name in _FIELDS:
            f[name] = f[name].reshape(B, M)
        f["q_col"][:], f["q_new"][:], f["q_slot"][:] = 0, 0, -1
        f["mv_src"][:], f["mv_dst"][:] = W - 1, W - 1
        f["w_col"][:], f["w_has"][:], f["fp_len"][:], f["positions"][:], f["kv_last_page_len"][:] = W - 1, 0, 0, 0, 0
        counts = np.zeros(B, dtype=np.int64)  # idle slots keep no pages in the table
        for b, s, st, n, p, new_pages in work:
            st.pages.extend(pool._free.pop() for _ in range(new_pages))
            nq = len(p.quant_rows)
            f["q_col"][b, :nq] = p.quant_rows
            if p.quant_new[1] > p.quant_new[0]:
                f["q_new"][b, nq] = 1
            lo, hi = p.q_range
            if hi > lo:
                i = np.arange(lo, hi)
                f["q_slot"][b, :hi - lo] = np.asarray(st.pages, dtype=np.int64)[i // P] * P + i % P
            for j, (src, dst) in enumerate(p.moves):
                f["mv_src"][b, j], f["mv_dst"][b, j] = src, dst
            if p.writes:
                f["w_col"][b], f["w_has"][b] = p.writes[0][1], 1
            f["fp_len"][b], f["positions"][b] = len(p.rows), n
            st.n = [n + 1] * L
            st.rows = [p.rows] * L
            if self._seq_of[b] != s:
                self._seq_of[b], self._known[b] = s, 0
            k = self._known[b]
            if len(st.pages) > k:
                self._pages[b, k:len(st.pages)] = st.pages[k:]
                self._known[b] = len(st.pages)
            counts[b] = -(-hi // P)
            f["kv_last_page_len"][b] = hi - (counts[b] - 1) * P if counts[b] else 0
        self.slot_seqs = {b: s for b, s, *_ in work}
        o = self._offsets
        indptr = a[o[len(_FIELDS) + len(_ROWS)]:o[len(_FIELDS) + len(_ROWS) + 1]]
        indptr[0] = 0
        indptr[1:] = np.cumsum(counts)
        nnz = int(indptr[-1])
        ind = a[o[-2]:o[-2] + nnz]
        ind[:] = self._pages[np.arange(self.max_pages)[None, :] < counts[:, None]]
        if self.buf.is_cuda:
            self.buf.copy_(h, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
            self._events[self._turn] = ev
            self._turn = (self._turn + 1) % len(self._host)
        else:
            self.buf.copy_(h)

    # ---- device -------------------------------------------------------------------------------
    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the planned step's tokens k, v [slots, Hk, D] at `layer`: the tokens leaving the window into
        pages (the pool's store function), the window compacted, the new tokens into their fp rows. Device
        work only, on buffers of fixed shape (capturable once the store kernels are compiled)."""
        pool, B, M, W = self.pool, self.B, self.M, self.W
        layer = pool._layer(layer)
        shape = (B, pool.n_kv_heads, pool.head_dim)
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.device != pool.device:
                raise ValueError(f"{name} must be a tensor {list(shape)} (slots, KV heads, head_dim) on "
                                 f"{pool.device}, got {tuple(t.shape) if isinstance(t, torch.Tensor) else t!r}")
        st = pool._static[layer]
        if not st["set"]:
            ks, vs = pool.specs[layer]
            if (ks.needs_tensor_scale or vs.needs_tensor_scale or (ks.calibrated and not st["k_cb"])
                    or (vs.calibrated and not st["v_cb"]) or (ks.smooth and not st["k_sm"])):
                raise ValueError(f"layer {layer}: static scales, calibrated codebooks and smoothing factors come from "
                                 "a layer's first append; prefill a sequence through pool.append (or "
                                 "set_static_scales) before decode steps")
            st["set"] = True
        k, v = pool.stored_keys(layer, k.detach().to(pool.fp_dtype)), v.detach().to(pool.fp_dtype)
        r2 = self._rows[:, None]
        for x, fp, key in ((k, pool.k_fp[layer], "k"), (v, pool.v_fp[layer], "v")):
            if W:
                src = fp[r2, :, self.q_col]  # [B, M, Hk, D]
                src = torch.where(self.q_new[:, :, None, None] != 0, x[:, None], src)
            else:
                src = x[:, None]
            src = src.reshape(B * M, *shape[1:])
            for part in pool.parts[layer]:  # one part unless the layer has per-head specs
                spec, pages = part.side(key)
                pool._store_fn(part.take(src, 1), pages, self.q_slot.reshape(-1), spec, self.P, st[key],
                               st[key + "_ts"])
            if W:
                if M > 1:
                    fp[r2, :, self.mv_dst] = fp[r2, :, self.mv_src]  # gathered before scattered
                cur = fp[self._rows, :, self.w_col]  # [B, Hk, D]
                fp[self._rows, :, self.w_col] = torch.where(self.w_has[:, None, None] != 0, x, cur)

    def attention_args(self, layer: int):
        """(args, kwargs) of `decode` after the model's q: pages, this step's block table and fp buffers. A layer
        with per-head specs has one set per part: `attention_parts`."""
        parts = self.attention_parts(layer)
        if len(parts) > 1:
            raise ValueError(f"layer {layer} holds per-head specs; attend per part through step.attention_parts(layer)")
        return parts[0][1], parts[0][2]

    def attention_parts(self, layer: int) -> list:
        """[(HeadPart, args, kwargs)] of `decode` for each group of KV heads of `layer` (one for a layer without
        per-head specs): the part's pages and its heads of the fp buffers; the caller passes the part's query heads
        (`kvlab.cache.head_parts.part_queries`)."""
        out = []
        fk, fv = self.pool.k_fp[layer][:self.B], self.pool.v_fp[layer][:self.B]
        for part, lc in self.pool.layer_parts(layer):
            args = (lc.k_pages, lc.v_pages, self.kv_indptr, self.kv_indices, self.kv_last_page_len, lc.k_spec,
                    lc.v_spec, self.P)
            kw = dict(k_fp=part.take(fk, 1), v_fp=part.take(fv, 1),
                      fp_len=self.fp_len, k_tensor_scale=lc.k_tensor_scale, v_tensor_scale=lc.v_tensor_scale,
                      max_kv_len=self.max_pages * self.P)  # no slot holds more: caps the split count
            if not self.W:  # a pool that never holds full-precision tokens: no fp operands (the kernels' HAS_FP
                kw.update(k_fp=None, v_fp=None, fp_len=None)  # path costs registers: bf16 decode 1.7x slower with it)
            out.append((part, args, kw))
        return out
