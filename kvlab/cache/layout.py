"""Page layout of one quantized cache tensor (K or V): the contract between the oracle, the
paged pool, the store kernel and the attention kernels.

Pages are head-major (FlashInfer's HND): one page holds `page_size` consecutive tokens of one
sequence for every KV head, and one (page, head) tile is contiguous, so a kernel reads a
tile's codes as whole 16-byte rows and its scales as one contiguous vector.

    tok / head / tensor axis         codes   uint8  [N, Hk, P, row_bytes]     row_bytes = D * bits / 8
                                     scales  sdt    [N, Hk, P, D / G]         (G = D for head)
                                     zeros   sdt    [N, Hk, P, D / G]         (asym only)
    chan axis (KIVI keys)            codes   uint8  [N, Hk, P / G, D, G * bits / 8]
                                     scales  sdt    [N, Hk, P / G, D]
    bf16 / fp16                      values  dtype  [N, Hk, P, D]

Each row / group is exactly `kvlab.quantize(x, spec)` of that token (group): codes, scales
and zeros are the oracle's tensors placed in pages, bit for bit. Axis-tensor static scales and
NVFP4's fp32 tensor scale are one float32 per layer, held by the pool, not the pages.
Full-precision tokens (sinks, the recent window, an unfinished channel group) live outside
the pages, in the pool's dense full-precision buffer.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..spec import KVQuantSpec

SCALE_TORCH_DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "e8m0": torch.uint8,
                      "e4m3": torch.float8_e4m3fn}
FLOAT_TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
CODEBOOK_SLOTS = 16  # a calibrated codebook's table beside the pages: 2^bits levels padded with the last one


@dataclass(frozen=True)
class PageLayout:
    """Shapes and dtypes of the page tensors of one spec (see module doc)."""

    spec: KVQuantSpec
    head_dim: int
    page_size: int
    n_heads: int

    def __post_init__(self) -> None:
        self.spec.check_head_dim(self.head_dim)
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if self.spec.axis == "chan" and self.page_size % self.spec.group:
            raise ValueError(f"axis chan with group {self.spec.group} needs a page size that is a multiple of it "
                             f"(pages hold whole token groups); got page_size {self.page_size}")

    @property
    def group(self) -> int:
        return self.spec.group_size(self.head_dim)

    @property
    def row_bytes(self) -> int:
        return self.head_dim * self.spec.bits // 8

    @property
    def has_group_scales(self) -> bool:
        s = self.spec
        return s.has_scale and s.axis != "tensor" and not s.is_float_storage

    def code_shape(self, n_pages: int) -> tuple:
        P, H, D, G = self.page_size, self.n_heads, self.head_dim, self.group
        if self.spec.is_float_storage:
            return (n_pages, H, P, D)
        if self.spec.axis == "chan":
            return (n_pages, H, P // G, D, G * self.spec.bits // 8)
        return (n_pages, H, P, self.row_bytes)

    def scale_shape(self, n_pages: int) -> tuple:
        P, H, D, G = self.page_size, self.n_heads, self.head_dim, self.group
        if self.spec.axis == "chan":
            return (n_pages, H, P // G, D)
        return (n_pages, H, P, D // G)

    def slot_shape(self, n_pages: int) -> tuple:
        """Shape of an `out=N` spec's outlier slots, `pages["out_idx"]` / `["out_val"]`: per token (every axis)."""
        return (n_pages, self.n_heads, self.page_size, self.spec.outliers)

    @property
    def code_dtype(self) -> torch.dtype:
        return FLOAT_TORCH_DTYPES[self.spec.fmt] if self.spec.is_float_storage else torch.uint8

    @property
    def scale_dtype(self) -> torch.dtype:
        return SCALE_TORCH_DTYPES[self.spec.scale_dtype]

    def bytes_per_token(self) -> float:
        """Stored bytes per token per head (codes + scales + zeros + outlier slots)."""
        return self.head_dim * self.spec.bits_per_element_at(self.head_dim) / 8

    def check_pages(self, pages: dict, device, name: str = "pages", other: str = "x") -> int:
        """Validate a page dict ({"codes", "scales", "zeros"}) against this layout on `device` (the
        device of the caller's tensor named `other`); raises ValueError naming the bad tensor.
        Returns the number of pages N."""
        # every message is formatted only on failure (`need` takes a callable): the checks run on each attention call
        def need(cond: bool, msg) -> None:
            if not cond:
                raise ValueError(msg())
        need(isinstance(pages, dict) and isinstance(pages.get("codes"), torch.Tensor),
             lambda: f"{name} must be a dict with tensor 'codes' (and 'scales'/'zeros'), as PageLayout.allocate "
             "returns")
        codes, spec = pages["codes"], self.spec
        N = codes.shape[0] if codes.dim() else 0
        shape = self.code_shape(N)
        need(tuple(codes.shape) == shape, lambda: f"{name}['codes'] has shape {tuple(codes.shape)}; spec {spec} "
             f"with head_dim {self.head_dim}, page_size {self.page_size}, {self.n_heads} KV heads needs {shape}")
        need(codes.dtype == self.code_dtype,
             lambda: f"{name}['codes'] dtype {codes.dtype}; spec {spec} needs {self.code_dtype}")
        need(codes.device == torch.device(device), lambda: f"{name}['codes'] is on {codes.device}, {other} on {device}")
        scaled = self.has_group_scales
        for key in ("scales", "zeros"):
            t = pages.get(key)
            if not (scaled and (key == "scales" or not spec.sym)):
                need(t is None, lambda: f"{name}[{key!r}] is given but spec {spec} stores no {key} in pages")
                continue
            need(isinstance(t, torch.Tensor), lambda: f"{name}[{key!r}] (a tensor) is required for spec {spec}")
            sshape = self.scale_shape(N)
            need(tuple(t.shape) == sshape, lambda: f"{name}[{key!r}] has shape {tuple(t.shape)}; expected {sshape}")
            need(t.dtype == self.scale_dtype,
                 lambda: f"{name}[{key!r}] dtype {t.dtype}; spec {spec} needs {self.scale_dtype}")
            need(t.device == codes.device,
                 lambda: f"{name}[{key!r}] is on {t.device}, {name}['codes'] on {codes.device}")
        cb = pages.get("codebook")
        if spec.calibrated:
            need(isinstance(cb, torch.Tensor) and tuple(cb.shape) == (CODEBOOK_SLOTS,) and cb.dtype == torch.float32
                 and cb.device == codes.device, lambda: f"{name}['codebook'] (float32 [{CODEBOOK_SLOTS}] on "
                 f"{codes.device}: the calibrated levels, then copies of the last) is required for spec {spec}, got "
                 f"{getattr(cb, 'shape', cb)}")
        else:
            need(cb is None, lambda: f"{name}['codebook'] is given but spec {spec} is not calibrated")
        for key, on, dt, what, verb in (("smooth", spec.smooth, torch.float32, "key smoothing factors", "smooth"),
                                        ("perm", spec.permute, torch.int64, "key channel order", "permute")):
            t = pages.get(key)
            if on:
                need(isinstance(t, torch.Tensor) and tuple(t.shape) == (self.n_heads, self.head_dim) and t.dtype == dt
                     and t.device == codes.device, lambda: f"{name}[{key!r}] ({str(dt).replace('torch.', '')} "
                     f"[{self.n_heads}, {self.head_dim}] on {codes.device}: the layer's {what}) is required for spec "
                     f"{spec}, got {getattr(t, 'shape', t)}")
            else:
                need(t is None, lambda: f"{name}[{key!r}] is given but spec {spec} does not {verb}")
        for key, dt in (("out_idx", torch.uint8), ("out_val", torch.float16)):
            t = pages.get(key)
            if spec.outliers:
                need(isinstance(t, torch.Tensor) and tuple(t.shape) == self.slot_shape(N) and t.dtype == dt
                     and t.device == codes.device, lambda: f"{name}[{key!r}] ({dt} {self.slot_shape(N)} on "
                     f"{codes.device}: the outlier slots) is required for spec {spec}, got "
                     f"{getattr(t, 'dtype', '')} {tuple(getattr(t, 'shape', ())) or t}")
            else:
                need(t is None, lambda: f"{name}[{key!r}] is given but spec {spec} keeps no outlier slots")
        return N

    def allocate(self, n_pages: int, device="cpu") -> dict[str, torch.Tensor | None]:
        """Empty page tensors {"codes", "scales", "zeros"} (scales/zeros None when not stored), plus "codebook"
        (float32 [16]: the levels, then copies of the last, as the kernels read them) for a calibrated spec and
        "smooth" (float32 [Hk, D]: the factors the stored keys were divided by) for a smoothed one, "perm" (int64
        [Hk, D]: the channel order the stored keys are in; the identity until the pool sets it) for a permuted one,
        "out_idx" (uint8)
        and "out_val" (float16) [n_pages, Hk, page_size, N] for a spec with N outlier slots."""
        codes = torch.empty(self.code_shape(n_pages), dtype=self.code_dtype, device=device)
        scales = zeros = None
        if self.has_group_scales:
            scales = torch.empty(self.scale_shape(n_pages), dtype=self.scale_dtype, device=device)
            if not self.spec.sym:
                zeros = torch.empty(self.scale_shape(n_pages), dtype=self.scale_dtype, device=device)
        out = {"codes": codes, "scales": scales, "zeros": zeros}
        if self.spec.calibrated:  # the layer's levels, set by the pool (NaN until then: never read as valid)
            out["codebook"] = torch.full((CODEBOOK_SLOTS,), float("nan"), dtype=torch.float32, device=device)
        if self.spec.smooth:  # the layer's key smoothing factors, set by the pool (NaN until then)
            out["smooth"] = torch.full((self.n_heads, self.head_dim), float("nan"), dtype=torch.float32,
                                       device=device)
        if self.spec.permute:
            out["perm"] = torch.arange(self.head_dim, device=device).repeat(self.n_heads, 1)
        if self.spec.outliers:
            out["out_idx"] = torch.zeros(self.slot_shape(n_pages), dtype=torch.uint8, device=device)
            out["out_val"] = torch.zeros(self.slot_shape(n_pages), dtype=torch.float16, device=device)
        return out
