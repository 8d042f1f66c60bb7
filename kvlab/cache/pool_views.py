"""Read side of `KVPool`: block tables, slots, fp-buffer views, dense reference K/V, byte counts."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .block_table import BlockTable, build_block_table, slots_of
from .capacity import fp_token_bytes, layout_page_bytes
from .paging import read_values


@dataclass
class LayerCache:
    """Everything attention needs of one layer. scale: the raw static scale the store uses;
    tensor_scale: the float32 multiplier attention applies (NVFP4 ts, or the stored axis-tensor scale)."""
    k_spec: object
    v_spec: object
    k_pages: dict
    v_pages: dict
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None
    k_tensor_scale: torch.Tensor | None
    v_tensor_scale: torch.Tensor | None


@dataclass
class FpView:
    """Full-precision tokens of a batch: k, v [B, Hk, W, D] (rows >= length[b] unused), length int32
    [B], positions int64 [B, W] (-1 where unused). Row order is arbitrary (softmax ignores it)."""
    k: torch.Tensor
    v: torch.Tensor
    length: torch.Tensor
    positions: torch.Tensor


class PoolViews:
    """Mixin of KVPool (uses its attributes: specs, policy, pages, fp buffers, _seqs, _static)."""

    def _batch(self, seq_ids) -> list[int]:
        ids = self.seq_ids if seq_ids is None else [int(s) for s in seq_ids]
        for s in ids:
            self._seq(s)
        return ids

    def block_table(self, seq_ids=None, layer: int = 0) -> BlockTable:
        """CSR table (kv_indptr [B+1], kv_indices [nnz], kv_last_page_len [B], int32) over the
        quantized pages of `seq_ids` (default: all live, ascending) at `layer` (all layers agree
        once a step's appends reach them). Page token i sits at position `sink + i`."""
        ids, layer = self._batch(seq_ids), self._layer(layer)
        n = [self.policy.n_quantized(self._seqs[s].n[layer]) for s in ids]
        return build_block_table([self._seqs[s].pages for s in ids], n, self.page_size, self.device)

    def slot_mapping(self, seq_id: int, positions, layer: int = 0) -> torch.Tensor:
        """int64 slots (page * P + offset) of quantized positions of a sequence."""
        st, nq = self._seq(seq_id), self.n_quantized(seq_id, layer)
        idx = [int(p) - self.policy.sink for p in positions]
        bad = [p for p, i in zip(positions, idx) if not 0 <= i < nq]
        if bad:
            raise ValueError(f"positions {bad[:8]} are not in pages (quantized positions: "
                             f"[{self.policy.sink}, {self.policy.sink + nq}))")
        return torch.tensor([slots_of(st.pages, i, i + 1, self.page_size)[0] for i in idx], dtype=torch.int64,
                            device=self.device)

    def fp_buffer(self, layer: int, seq_ids=None) -> FpView:
        """Full-precision tokens of `seq_ids` (default: all live, ascending) at `layer`: a view of the
        buffer when the sequences' rows are contiguous and in order, else a gathered copy."""
        ids, layer = self._batch(seq_ids), self._layer(layer)
        rows = [self._seqs[s].row for s in ids]
        W = self.policy.capacity
        if rows and rows == list(range(rows[0], rows[0] + len(rows))):
            k, v = self.k_fp[layer][rows[0]:rows[0] + len(rows)], self.v_fp[layer][rows[0]:rows[0] + len(rows)]
        else:
            r = torch.tensor(rows, dtype=torch.long, device=self.device)
            k, v = self.k_fp[layer][r], self.v_fp[layer][r]
        pos = torch.full((len(ids), W), -1, dtype=torch.int64)
        for b, s in enumerate(ids):
            held = self._seqs[s].rows[layer]
            pos[b, :len(held)] = torch.tensor(held, dtype=torch.int64)
        length = torch.tensor([len(self._seqs[s].rows[layer]) for s in ids], dtype=torch.int32)
        return FpView(k, v, length.to(self.device), pos.to(self.device))

    def dense_kv(self, seq_id: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(k, v) float32 [Hk, T, D] of a sequence at `layer` in position order: dequantized page
        tokens and full-precision tokens, exactly what attention over the cache sees (keys pre-RoPE for prerope K
        specs; a smoothed / permuted K spec's keys multiplied back by its factors in the model's channel order, as the
        scores see them)."""
        st, layer = self._seq(seq_id), self._layer(layer)
        n, nq, S = st.n[layer], self.policy.n_quantized(st.n[layer]), self.policy.sink
        held = torch.tensor(st.rows[layer], dtype=torch.long, device=self.device)
        out = []
        for fp, key in ((self.k_fp[layer], "k"), (self.v_fp[layer], "v")):
            x = torch.empty(self.n_kv_heads, n, self.head_dim, dtype=torch.float32, device=self.device)
            for part in self.parts[layer]:  # one part for a layer without per-head specs
                spec, pages = part.side(key)
                x[part.index, S:S + nq] = read_values(pages, spec, st.pages, nq, self.head_dim,
                                                      scale=self._static[layer][key],
                                                      tensor_scale=self._static[layer][key + "_ts"])
            x[:, held] = fp[st.row][:, :len(held)].float()
            out.append(x)
        if self.specs[layer][0].permute:
            from ..quant.permutation import unpermute_channels
            out[0] = unpermute_channels(out[0], self.k_pages[layer]["perm"], heads_dim=-3)
        if self.specs[layer][0].smooth:
            from ..quant.smoothing import unsmooth_keys
            out[0] = unsmooth_keys(out[0], self.k_pages[layer]["smooth"], heads_dim=-3)
        return out[0], out[1]

    def layer_cache(self, layer: int) -> LayerCache:
        """Specs, page tensors and static scales of one layer (what attention kernels take). A layer with per-head
        specs has none: read it through `layer_parts`."""
        if len(self.parts[self._layer(layer)]) > 1:
            raise ValueError(f"layer {layer} holds per-head specs in {len(self.parts[layer])} page sets; read it "
                             "through pool.layer_parts(layer) (one LayerCache per group of KV heads)")
        return self._part_cache(layer, self.parts[layer][0])

    def layer_parts(self, layer: int) -> list:
        """[(HeadPart, LayerCache)] of one layer: one entry holding every KV head for a layer without per-head
        specs, else one per group of heads sharing a spec pair. Attention runs once per entry on the part's heads
        (`HeadPart.take` for the full-precision buffers, `head_parts.part_queries` for the queries)."""
        return [(part, self._part_cache(layer, part)) for part in self.parts[self._layer(layer)]]

    def _part_cache(self, layer: int, part) -> LayerCache:
        from ..quant.formats import scale_value, store_scale
        st = self._static[layer]
        kspec, vspec = part.k_spec, part.v_spec

        def mult(spec, key):
            if spec.tensor_scale:
                return st[key + "_ts"]
            if spec.static_scale and st[key] is not None:
                return scale_value(store_scale(st[key], spec.scale_dtype, elem_fmt=spec.fmt), spec.scale_dtype)
            return None
        return LayerCache(kspec, vspec, part.k_pages, part.v_pages, st["k"], st["v"], mult(kspec, "k"),
                          mult(vspec, "v"))

    # ---- bytes ----------------------------------------------------------------------------
    def bytes_per_token(self) -> float:
        """Bytes one quantized token costs: all layers, K + V, codes + scales + zeros (exact:
        page bytes / P). Full-precision tokens cost `fp_bytes_per_token()` instead."""
        return sum(layout_page_bytes(p.k_layout) + layout_page_bytes(p.v_layout) for parts in self.parts
                   for p in parts) / self.page_size

    def fp_bytes_per_token(self) -> int:
        """Bytes one full-precision token costs (all layers, K + V, fp_dtype)."""
        return fp_token_bytes(self.n_layers, self.n_kv_heads, self.head_dim,
                              torch.empty(0, dtype=self.fp_dtype).element_size())

    def nbytes(self) -> int:
        """Bytes the pool allocated: page tensors (with calibrated codebook tables), fp buffers, static scales (4 bytes
        each)."""
        n = sum(t.numel() * t.element_size() for parts in self.parts for p in parts for pages in (p.k_pages, p.v_pages)
                for t in pages.values() if t is not None)
        n += sum(t.numel() * t.element_size() for t in (*self.k_fp, *self.v_fp))
        return n + 4 * sum(int(s.static_scale) + int(s.tensor_scale) for pair in self.specs for s in pair)
