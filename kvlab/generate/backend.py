"""`PagedBackend`: the decoder's attention over a real `KVPool` and the paged kernels.

A prefill chunk of T > 1 tokens attends through `extend` to everything the pool holds for its sequences plus
the chunk itself in full precision (as serving engines' chunked prefill does), then the chunk is stored
(quantize + pack + scatter). A decode step (T = 1) stores the new token first, then attends through `decode`
to the whole cache, the new token read back as stored (as an engine's decode step reads it; kvlab's
decode-faithful evaluation scores exactly that). The sequences of one call share their positions.

`StepBackend` runs decode steps of a `kvlab.cache.DecodeStep` instead: one token per batch slot, sequences of
different lengths (positions [B, 1]), the pool written by index tensors planned once per step, every shape
fixed: what `kvlab.generate.Batcher` captures in a CUDA graph.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..cache.head_parts import part_queries
from ..kernels.decode import decode
from ..kernels.extend import extend


def _refuse_prerope(scheme) -> None:
    for name, spec in (("K", scheme.k), ("V", scheme.v)):
        if spec.pre_rope:
            raise ValueError(f"{name} spec {spec} stores keys before RoPE; the paged kernels do not apply RoPE "
                             "after dequantizing (issue 16): generate with a post-RoPE scheme")


class PagedBackend:
    """AttentionBackend over `pool` for the sequences `seq_ids` (one batch row each, in order).

    kernels: "triton" (the Triton / Gluon kernels by default dispatch; on the CPU under TRITON_INTERPRET=1) or
    "reference" (the torch float32 backends of the same ops)."""

    def __init__(self, pool, seq_ids, kernels: str = "triton") -> None:
        _refuse_prerope(pool.scheme)
        self.pool, self.seq_ids, self.kernels = pool, list(seq_ids), kernels
        self._table = (None, None)  # (per-sequence (pages, quantized tokens), CSR block table) of the last layer

    def _block_table(self, layer: int):
        """The CSR block table at `layer`. Within a step every layer holds the same pages and counts once its
        append is done, so the table built for one layer serves the next (pages only grow while a backend
        lives): it is rebuilt, host to device, only when a count changed."""
        p = self.pool
        key = tuple((len(p.pages_of(s)), p.n_quantized(s, layer)) for s in self.seq_ids)
        if self._table[0] != key:
            self._table = (key, p.block_table(self.seq_ids, layer))
        return self._table[1]

    @property
    def seq_len(self) -> int:
        return self.pool.seq_len(self.seq_ids[0])

    def _prefix(self, layer: int) -> list:
        """[(HeadPart, args, kwargs)] of the ops over `layer`'s cache: one entry, or one per group of KV heads of a
        layer with per-head specs (its pages and its heads of the fp buffers)."""
        p = self.pool
        bt, fp = self._block_table(layer), p.fp_buffer(layer, self.seq_ids)
        out = []
        for part, lc in p.layer_parts(layer):
            args = (lc.k_pages, lc.v_pages, bt.kv_indptr, bt.kv_indices, bt.kv_last_page_len, lc.k_spec, lc.v_spec,
                    p.page_size)
            kw = dict(k_fp=part.take(fp.k, 1), v_fp=part.take(fp.v, 1), fp_len=fp.length,
                      k_tensor_scale=lc.k_tensor_scale, v_tensor_scale=lc.v_tensor_scale, backend=self.kernels)
            if not p.policy.capacity:  # no full-precision tokens ever: no fp operands (see DecodeStep.attention_args)
                kw.update(k_fp=None, v_fp=None, fp_len=None)
            out.append((part, args, kw))
        return out

    def attend(self, layer: int, q: Tensor, k_pre: Tensor, k: Tensor, v: Tensor, positions: Tensor, model) -> Tensor:
        B, Hq, T, D = q.shape  # q [B, Hq, T, D]; k, v [B, Hk, T, D]
        if B != len(self.seq_ids):
            raise ValueError(f"a batch of {B} rows for {len(self.seq_ids)} sequences")
        dt = self.pool.fp_dtype
        Hk = k.shape[1]
        if T == 1:
            self.pool.append_batch(self.seq_ids, layer, k[:, :, 0], v[:, :, 0])  # [B, Hk, D]
            q1 = q[:, :, 0].to(dt).contiguous()  # [B, Hq, D]
            out = None
            for part, args, kw in self._prefix(layer):
                if self.kernels == "triton":  # the longest sequence's paged tokens, known on the host: split programs
                    # past it would read nothing (Gemma 3's 512-token sliding layers, short contexts)
                    kw["max_kv_len"] = max([1] + [n for _, n in self._table[0]])
                if part.whole:
                    return decode(q1, *args, **kw)[:, :, None].to(q.dtype)
                out = torch.empty_like(q1) if out is None else out
                qh = part_queries(part, Hq, Hk)
                out[:, qh] = decode(q1.index_select(1, qh).contiguous(), *args, **kw)
            return out[:, :, None].to(q.dtype)
        # static / tensor scales come from the layer's first append (of sequence 0 below): take them now from the same
        # tokens, so this chunk's attention already has them (NVFP4's tensor scale)
        self.pool.calibrate_from(layer, k[0].transpose(0, 1), v[0].transpose(0, 1))  # [T, Hk, D] views
        flat = (lambda t: t.transpose(1, 2).reshape(B * T, t.shape[1], D).to(dt).contiguous())  # noqa: E731
        qo = torch.arange(0, B * T + 1, T, dtype=torch.int32, device=q.device)
        bt = self._block_table(layer)  # the lengths on the host too: the dense prefix plans without a device read
        qf, kf, vf = flat(q), flat(k), flat(v)  # [B*T, H, D]
        out = None
        for part, args, kw in self._prefix(layer):
            kw["backend"] = "auto" if self.kernels == "triton" else self.kernels  # extend's default dispatch
            qh = part_queries(part, Hq, Hk)
            o = extend(part.take(qf, 1) if part.whole else qf.index_select(1, qh).contiguous(),
                       part.take(kf, 1).contiguous(), part.take(vf, 1).contiguous(), qo, *args, **kw, max_qo_len=T,
                       host_lens=(list(range(0, B * T + 1, T)), *bt.host))  # [B*T, Hq(part), D]
            if part.whole:
                out = o
            else:  # per-head specs: each group of KV heads writes its query heads
                out = torch.empty_like(qf) if out is None else out
                out[:, qh] = o
        for b, s in enumerate(self.seq_ids):
            self.pool.append(s, layer, k[b].transpose(0, 1), v[b].transpose(0, 1))  # [T, Hk, D]
        return out.reshape(B, T, Hq, D).transpose(1, 2).to(q.dtype)


class StepBackend:
    """AttentionBackend for decode steps over `step` (a planned `DecodeStep`): each layer writes the slots' new
    tokens through the step's index tensors, then attends through `decode` with the step's block table and fp
    buffers. Idle slots read nothing and return 0. kernels: as `PagedBackend`."""

    def __init__(self, step, kernels: str = "triton") -> None:
        _refuse_prerope(step.pool.scheme)
        self.step, self.kernels = step, kernels

    def attend(self, layer: int, q: Tensor, k_pre: Tensor, k: Tensor, v: Tensor, positions: Tensor, model) -> Tensor:
        B, Hq, T, D = q.shape  # q [B, Hq, 1, D]; k, v [B, Hk, 1, D]
        if T != 1 or B != self.step.B:
            raise ValueError(f"a decode step takes one token for each of {self.step.B} slots, got [B={B}, T={T}]")
        self.step.write(layer, k[:, :, 0], v[:, :, 0])
        dt = self.step.pool.fp_dtype
        q1 = q[:, :, 0].to(dt).contiguous()  # [B, Hq, D]
        parts = self.step.attention_parts(layer)
        if len(parts) == 1:
            _, args, kw = parts[0]
            return decode(q1, *args, **kw, backend=self.kernels)[:, :, None].to(q.dtype)
        out = torch.empty_like(q1)  # per-head specs: each group of KV heads on its query heads
        for part, args, kw in parts:
            qh = part_queries(part, Hq, k.shape[1])
            out[:, qh] = decode(q1.index_select(1, qh).contiguous(), *args, **kw, backend=self.kernels)
        return out[:, :, None].to(q.dtype)
