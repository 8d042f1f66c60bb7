"""`encode`: the bytes an engine stores for x; `decode_bytes`: values back from those bytes.

Block layout, one block per scale group, blocks in row order:

    [scale bytes][zero bytes][code planes]      (little-endian scales, planes as in packing.py)

For the GGML presets this is exactly GGML's block_q4_0 / q4_1 / q5_0 / q5_1 / q8_0 / mxfp4
(d, [m], [qh], qs), so `encode(x, q4_0)` equals `gguf.quants.quantize(x, Q4_0)`. Specs with
no per-group scale (unit-scale fp8, axis tensor, bf16/fp16) store only the codes; a static
tensor scale (axis tensor, NVFP4's fp32 second level) lives outside the rows, in the spec
file an exporter writes. Axis chan rows are [token group][channel] blocks.

Outlier slots (`out=N`) follow a row's blocks: each token's N fp16 values (little-endian), then its N uint8
channel indices (3 N bytes a token; an axis-chan row of G tokens carries its G tokens' slots in token order).
"""
from __future__ import annotations

import numpy as np
import torch

from .formats import scale_bytes
from ..spec import as_spec
from .oracle import dequantize, group, quantize
from .packing import bytes_per_group
from .qtensor import QTensor


def _block_parts(q: QTensor) -> list[torch.Tensor]:
    parts = []
    for t in (q.scales, q.zeros):
        if t is not None and t.dim() > 0:  # per-group scales live in the blocks
            parts.append(scale_bytes(t))
    return parts + [q.codes]


def encode(x: torch.Tensor, spec, **kw) -> np.ndarray:
    """Engine bytes of x [..., T, D]: uint8 array [..., T, row_bytes] ([..., T/G, row_bytes] for axis chan)."""
    spec = as_spec(spec)
    q = quantize(x, spec, **kw)
    blocks = torch.cat(_block_parts(q), dim=-1)  # [..., A, B, block_bytes]
    rows = blocks.reshape(*blocks.shape[:-2], -1)
    if spec.outliers:  # [..., T, 3N] per token, after the row's blocks
        sl = torch.cat([q.out_val.contiguous().view(torch.uint8), q.out_idx], -1)
        if spec.axis == "chan":
            sl = sl.reshape(*sl.shape[:-2], sl.shape[-2] // spec.group, -1)
        rows = torch.cat([rows, sl], -1)
    return rows.cpu().numpy()


def block_bytes(spec, head_dim: int) -> int:
    """Bytes of one block (one scale group) of `spec` for rows of `head_dim`."""
    spec = as_spec(spec)
    G = spec.group_size(head_dim)
    if spec.is_float_storage:
        return head_dim * 2
    n = bytes_per_group(spec, G)
    if spec.axis != "tensor" and spec.has_scale:
        n += int(spec.scale_bytes_per_group())
    return n


def decode_bytes(b: np.ndarray, spec, shape, *, scale=None, tensor_scale=None, codebook=None,
                 dtype=torch.float32) -> torch.Tensor:
    """Values of engine bytes `b` (as `encode` wrote them) for a tensor of `shape`.

    `scale` / `tensor_scale`: the out-of-row static scales, when the spec has them; `codebook`: a calibrated
    spec's (`cal`) levels, float [2^bits], which live beside the cache, not in its rows.
    """
    spec = as_spec(spec)
    shape = tuple(shape)
    t = torch.from_numpy(np.ascontiguousarray(b, dtype=np.uint8))
    # Shape of the grouped tensor tells A, B; the block splits into scale/zero/code parts.
    probe = group(torch.empty(shape, device="meta"), spec) if not spec.is_float_storage else None
    A_B = probe.shape[:-1] if probe is not None else (*shape[:-1], 1)
    oi = ov = None
    if spec.outliers:  # the slots after each row's blocks: N fp16 values, then N uint8 indices, per token
        n = spec.outliers
        rows = t.reshape(*A_B[:-1], -1)
        tail = 3 * n * (spec.group if spec.axis == "chan" else 1)
        sl = rows[..., rows.shape[-1] - tail:].reshape(*shape[:-1], 3 * n)
        ov, oi = sl[..., :2 * n].contiguous().view(torch.float16), sl[..., 2 * n:].contiguous()
        t = rows[..., :rows.shape[-1] - tail]
    blocks = t.reshape(*A_B, -1)
    sdt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "e8m0": torch.uint8,
           "e4m3": torch.float8_e4m3fn}[spec.scale_dtype]
    off, scales, zeros = 0, None, None
    per_group_scale = spec.has_scale and spec.axis != "tensor" and not spec.is_float_storage
    if per_group_scale:
        nb = torch.empty((), dtype=sdt).element_size()
        scales = blocks[..., :nb].contiguous().view(sdt).squeeze(-1)
        off = nb
        if not spec.sym:
            zeros = blocks[..., off:off + nb].contiguous().view(sdt).squeeze(-1)
            off += nb
    elif spec.has_scale and not spec.is_float_storage:
        if scale is None:
            raise ValueError(f"spec {spec} keeps its scale outside the rows; pass scale=")
        scales = torch.as_tensor(scale).to(sdt).reshape(())
    ts = None
    if spec.tensor_scale:
        if tensor_scale is None:
            raise ValueError(f"spec {spec} has a tensor scale outside the rows; pass tensor_scale=")
        ts = torch.as_tensor(tensor_scale, dtype=torch.float32)
    cb = None if codebook is None else torch.as_tensor(codebook, dtype=torch.float32)
    q = QTensor(blocks[..., off:].contiguous(), scales, zeros, ts, spec, shape, dtype, cb, out_idx=oi, out_val=ov)
    return dequantize(q)
