"""Outlier slots (`out=N`): dense-and-sparse quantization in a paged-friendly form.

Each token vector (one kv head's head_dim values) keeps its N values of largest magnitude in full precision (fp16)
with their channel index (uint8): a fixed 3 N bytes a token, so pages stay fixed-size (KVQuant keeps a variable
1% of outliers in a sparse matrix, which a paged cache cannot address per token). The dense codes never see them:
each outlier is replaced by the mean of the other elements of its scale group before the group's statistics are
taken, so one large channel no longer widens the scale of the 31 elements beside it. Dequantization writes the N
values back over their channels.

Selection is deterministic (the oracle is the byte contract): magnitudes in descending order, NaN and inf first,
the lowest channel first on ties. A NaN or inf in a slot stays in its own element (it no longer poisons its group,
as it does without slots) unless a vector has more non-finite values than slots.

Shapes: x [..., T, D] (float32, after smoothing and rotation: the space the codes are in); idx uint8 [..., T, N];
val float16 [..., T, N]; mask bool [..., T, D] (True at the slots).
"""
from __future__ import annotations

import torch


def select(x: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The n slots of each vector of x [..., D]: (idx uint8 [..., n], val fp16 [..., n], mask bool [..., D])."""
    mag = x.abs()
    mag = torch.where(mag != mag, float("inf"), mag)  # NaN ranks with inf; stable: the lower channel first
    order = torch.sort(mag, dim=-1, descending=True, stable=True).indices[..., :n]
    val = x.gather(-1, order).to(torch.float16)
    mask = torch.zeros(x.shape, dtype=torch.bool, device=x.device).scatter_(-1, order, True)
    return order.to(torch.uint8), val, mask


def fill(xg: torch.Tensor, mg: torch.Tensor) -> torch.Tensor:
    """Groups xg [..., G] with their slot elements (mg True) replaced by the mean of the group's other elements
    (0 where every element of a group is a slot): what the dense codes quantize."""
    rest = ~mg
    cnt = rest.sum(-1, keepdim=True)
    mean = torch.where(rest, xg, 0.0).sum(-1, keepdim=True) / cnt.clamp(min=1)
    return torch.where(mg, torch.where(cnt > 0, mean, 0.0), xg)


def apply(y: torch.Tensor, idx: torch.Tensor, val: torch.Tensor) -> torch.Tensor:
    """y [..., D] with the slot values val [..., n] written over channels idx [..., n] (a new tensor)."""
    return y.scatter(-1, idx.long(), val.to(y.dtype))


def check_slots(idx, val, spec, shape) -> None:
    """ValueError unless idx / val are the slots an `out=N` spec's tensor of `shape` [..., D] needs."""
    n, want = spec.outliers, (*tuple(shape)[:-1], spec.outliers)
    if idx is None or val is None:
        raise ValueError(f"spec {spec} keeps {n} outlier slots a token vector: pass out_idx uint8 and out_val "
                         f"float16 of shape {want}")
    if idx.dtype != torch.uint8 or val.dtype != torch.float16 or tuple(idx.shape) != want or \
            tuple(val.shape) != want:
        raise ValueError(f"outlier slots of spec {spec} must be out_idx uint8 and out_val float16 of shape {want}, "
                         f"got {idx.dtype} {tuple(idx.shape)} and {val.dtype} {tuple(val.shape)}")
    if idx.numel() and int(idx.max()) >= shape[-1]:
        raise ValueError(f"outlier channel index {int(idx.max())} is past head_dim {shape[-1]}")


__all__ = ["select", "fill", "apply", "check_slots"]
