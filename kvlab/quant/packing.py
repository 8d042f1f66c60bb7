"""Bit-plane packing of unsigned codes into bytes, and back (torch, vectorised).

A `bits`-bit code is split into power-of-two planes, lowest bits first (6 -> 4 + 2). Each
plane of width w packs k = 8 / w elements per byte:

* `seq`:   element i of the group goes to byte i // k at bit (i % k) * w   (FreeToken)
* `ggml`:  element i goes to byte i % (G / k) at bit (i // (G / k)) * w    (GGML nibbles:
           byte j = element j | element j + 16 << 4); 1-bit planes stay `seq` (GGML's qh
           is a little-endian bit mask), 8-bit planes are the bytes themselves.

Plane order in a group's bytes: `seq` lowest plane first; `ggml` highest plane first (q5_0
stores qh before qs).
"""
from __future__ import annotations

import torch

from ..spec import KVQuantSpec


def _plane_layout(spec: KVQuantSpec, w: int) -> str:
    if w in (1, 8) or spec.pack == "seq":
        return "seq"
    return "strided"


def plane_order(spec: KVQuantSpec) -> list[tuple[int, int]]:
    """[(shift, width)] of the planes in the order their bytes are stored."""
    out, shift = [], 0
    for w in spec.planes:
        out.append((shift, w))
        shift += w
    return out[::-1] if spec.pack == "ggml" else out


def bytes_per_group(spec: KVQuantSpec, group: int) -> int:
    return group * spec.bits // 8


def pack(u: torch.Tensor, spec: KVQuantSpec) -> torch.Tensor:
    """Pack codes u [..., G] (uint8, each < 2**bits) into [..., G * bits / 8] uint8."""
    G = u.shape[-1]
    out = []
    for shift, w in plane_order(spec):
        p = ((u >> shift) & ((1 << w) - 1)).to(torch.int32)  # [..., G]
        k = 8 // w
        if _plane_layout(spec, w) == "seq":
            p = p.reshape(*u.shape[:-1], G // k, k)  # [..., G/k, k]: element i -> (i // k, i % k)
        else:
            p = p.reshape(*u.shape[:-1], k, G // k).transpose(-1, -2)  # element i -> (i % (G/k), i // (G/k))
        shifts = torch.arange(0, 8, w, device=u.device, dtype=torch.int32)
        out.append((p << shifts).sum(-1).to(torch.uint8))  # [..., G/k]
    return torch.cat(out, dim=-1)


def unpack(b: torch.Tensor, spec: KVQuantSpec, group: int) -> torch.Tensor:
    """Inverse of `pack`: bytes [..., G * bits / 8] -> codes [..., G] (uint8)."""
    lead = b.shape[:-1]
    u = torch.zeros(*lead, group, dtype=torch.int32, device=b.device)
    off = 0
    for shift, w in plane_order(spec):
        k = 8 // w
        nb = group // k
        pb = b[..., off:off + nb].to(torch.int32)  # [..., G/k]
        off += nb
        shifts = torch.arange(0, 8, w, device=b.device, dtype=torch.int32)
        p = (pb.unsqueeze(-1) >> shifts) & ((1 << w) - 1)  # [..., G/k, k]
        if _plane_layout(spec, w) == "seq":
            p = p.reshape(*lead, group)
        else:
            p = p.transpose(-1, -2).reshape(*lead, group)
        u |= p << shift
    return u.to(torch.uint8)
