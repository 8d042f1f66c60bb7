"""Key smoothing and channel permutation at the attention ops' boundary: a `smooth` / `perm` K spec's pages and
full-precision buffer hold (k / s)[..., perm] (s = k_pages["smooth"], float32 [Hk, D]; perm = k_pages["perm"], int64
[Hk, D]), so `decode` / `extend` read the queries as (q * s)[..., perm] (and store the chunk's own keys the cache's
way) and hand every backend a plain spec: no kernel knows about either (`kvlab.quant.smoothing`,
`kvlab.quant.permutation`); the cost is one elementwise multiply and / or one gather of q per call. No Triton import.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..quant.permutation import check_permutation, permute_channels, permute_queries
from ..quant.smoothing import check_smoothing, smooth_keys, smooth_queries, unsmoothed
from ..spec import as_spec
from .checks import need


@dataclass
class KeyFold:
    """What a layer's stored keys went through: smoothing factors s [Hk, D] and / or a channel order perm [Hk, D]."""
    smooth: torch.Tensor | None
    perm: torch.Tensor | None

    def queries(self, q: torch.Tensor) -> torch.Tensor:
        """q [..., Hq, D] as the stored keys meet it: (q * s)[..., perm]."""
        if self.smooth is not None:
            q = smooth_queries(q, self.smooth)
        return q if self.perm is None else permute_queries(q, self.perm)

    def planned(self, q_in: torch.Tensor, out: torch.Tensor):
        """A callable that writes `queries(q_in)` into `out` (both [..., Hq, D], fixed) with the factors and the
        gather index prepared once: one kernel for smoothing or a permutation alone, two for both (a decode plan
        refreshes its query this way on every replay)."""
        Hq = q_in.shape[-2]
        s = p = None
        if self.perm is not None:
            pr = self.perm.repeat_interleave(Hq // self.perm.shape[0], 0)             # [Hq, D]
            p = pr.expand(q_in.shape)
        if self.smooth is not None:
            s = self.smooth.repeat_interleave(Hq // self.smooth.shape[0], 0)          # [Hq, D]
            s = (s if p is None else torch.gather(s, -1, pr)).to(q_in.dtype)           # in the stored order
        if p is None:
            return lambda: torch.mul(q_in, s, out=out)
        if s is None:
            return lambda: torch.gather(q_in, -1, p, out=out)

        def both():
            torch.gather(q_in, -1, p, out=out)
            out.mul_(s)
        return both

    def keys(self, k: torch.Tensor) -> torch.Tensor:
        """Keys k [C, Hk, D] as the cache stores them: (k / s)[..., perm], contiguous."""
        if self.smooth is not None:
            k = smooth_keys(k, self.smooth)
        if self.perm is not None:
            k = permute_channels(k, self.perm)
        return k.contiguous()


def strip_key_fold(q, k_pages, k_spec, name: str = "k_pages"):
    """(q as the stored keys meet it, pages without "smooth" / "perm", the plain spec, a `KeyFold`) for a smoothed
    or permuted K spec; (q, k_pages, spec, None) otherwise. q [..., Hq, D]; ValueError when the factors or the
    permutation are missing or invalid."""
    spec = as_spec(k_spec)
    if not (spec.smooth or spec.permute):
        return q, k_pages, spec, None
    need(isinstance(k_pages, dict) and isinstance(k_pages.get("codes"), torch.Tensor) and k_pages["codes"].dim() >= 2,
         f"{name}['codes'] must be a page tensor [N, Hk, ...]")
    Hk, D = k_pages["codes"].shape[1], q.shape[-1]
    need(q.shape[-2] % Hk == 0, f"Hq={q.shape[-2]} query heads is not a multiple of Hk={Hk} KV heads")
    fold = KeyFold(None, None)
    if spec.smooth:
        need(isinstance(k_pages.get("smooth"), torch.Tensor), f"{name}['smooth'] (float32 [{Hk}, {D}], the layer's "
             f"key smoothing factors) is required for spec {spec}")
        s = k_pages["smooth"]
        need(s.device == k_pages["codes"].device, f"{name}['smooth'] is on {s.device}, codes on "
             f"{k_pages['codes'].device}")
        check_smoothing(s, Hk, D, f"{name}['smooth']")
        fold.smooth = s
    if spec.permute:
        p = k_pages.get("perm")
        need(isinstance(p, torch.Tensor) and p.dtype == torch.int64, f"{name}['perm'] (int64 [{Hk}, {D}], the "
             f"layer's key channel order) is required for spec {spec}")
        need(p.device == k_pages["codes"].device, f"{name}['perm'] is on {p.device}, codes on "
             f"{k_pages['codes'].device}")
        check_permutation(p, Hk, D, f"{name}['perm']")
        fold.perm = p
    pages = {k: v for k, v in k_pages.items() if k not in ("smooth", "perm")}
    return fold.queries(q), pages, unsmoothed(spec), fold


def stored_chunk_keys(k_new, fold):
    """A chunk's keys k_new [C, Hk, D] as a smoothed / permuted cache holds them; unchanged when fold is None."""
    return k_new if fold is None else fold.keys(k_new)
