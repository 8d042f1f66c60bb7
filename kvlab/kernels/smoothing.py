"""Key smoothing at the attention ops' boundary: a `smooth` K spec's pages and full-precision buffer hold k / s
(s = k_pages["smooth"], float32 [Hk, D]), so `decode` / `extend` multiply the queries by s (and divide the chunk's
own keys by s) and hand every backend a plain spec: no kernel knows about smoothing (`kvlab.quant.smoothing`); the
cost is one elementwise multiply of q per call. No Triton import."""
from __future__ import annotations

import torch

from ..quant.smoothing import check_smoothing, smooth_keys, smooth_queries, unsmoothed
from ..spec import as_spec
from .checks import need


def strip_smoothing(q, k_pages, k_spec, name: str = "k_pages"):
    """(q * s, pages without "smooth", spec without `smooth`, s) for a smoothed K spec; (q, k_pages, spec, None)
    otherwise. q [..., Hq, D]; ValueError when the factors are missing or invalid."""
    spec = as_spec(k_spec)
    if not spec.smooth:
        return q, k_pages, spec, None
    need(isinstance(k_pages, dict) and isinstance(k_pages.get("codes"), torch.Tensor) and k_pages["codes"].dim() >= 2,
         f"{name}['codes'] must be a page tensor [N, Hk, ...]")
    Hk, D = k_pages["codes"].shape[1], q.shape[-1]
    need(isinstance(k_pages.get("smooth"), torch.Tensor), f"{name}['smooth'] (float32 [{Hk}, {D}], the layer's key "
         f"smoothing factors) is required for spec {spec}")
    need(q.shape[-2] % Hk == 0, f"Hq={q.shape[-2]} query heads is not a multiple of Hk={Hk} KV heads")
    s = k_pages["smooth"]
    need(s.device == k_pages["codes"].device, f"{name}['smooth'] is on {s.device}, codes on {k_pages['codes'].device}")
    check_smoothing(s, Hk, D, f"{name}['smooth']")
    pages = {k: v for k, v in k_pages.items() if k != "smooth"}
    return smooth_queries(q, s), pages, unsmoothed(spec), s


def stored_chunk_keys(k_new, s):
    """A chunk's keys k_new [C, Hk, D] as a smoothed cache holds them (k / s); unchanged when s is None."""
    return k_new if s is None else smooth_keys(k_new, s).contiguous()
