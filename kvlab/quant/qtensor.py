"""`QTensor`: what the oracle (and the cache) stores for one quantized tensor."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..spec import KVQuantSpec


@dataclass
class QTensor:
    """A quantized tensor.

    codes:        uint8 [..., A, B, nbytes]  packed codes of each group (bit planes, see packing)
                  tok/head/tensor axis: A = tokens, B = groups per row; chan axis: A = token
                  groups, B = head_dim (channels); bf16/fp16: the raw value bytes, B = 1
    scales:       [..., A, B] in the scale dtype (float16/bfloat16/float32; uint8 biased
                  exponent for e8m0; float8_e4m3fn for e4m3); a 0-d tensor for axis tensor;
                  None when the spec stores no scale (rule unit)
    zeros:        like scales: GGML's "min" offset of asymmetric specs (x = scale * c + zero)
    tensor_scale: 0-d float32 second-level scale (NVFP4), else None
    spec:         the `KVQuantSpec`
    shape, dtype: shape and dtype of the original tensor
    codebook:     float32 [2^bits] levels of a calibrated spec (`cal`), else None
    smooth:       float32 factors of a smoothed spec (`smooth`), broadcastable to shape: the codes hold
                  x / smooth and `dequantize` multiplies back; None otherwise (or for codes read from pages,
                  which hold the smoothed keys)
    perm:         int64 channel order of a permuted spec (`perm`), broadcastable to shape: the codes hold
                  (x / smooth)[..., perm] and `dequantize` puts the channels back; None otherwise (or for codes read
                  from pages, which hold the permuted keys)
    out_idx, out_val: an `out=N` spec's outlier slots, uint8 channel indices and float16 values [..., T, N]
                  (`kvlab.quant.outliers`; in the rotated / smoothed space of the codes), else None
    """

    codes: torch.Tensor
    scales: torch.Tensor | None
    zeros: torch.Tensor | None
    tensor_scale: torch.Tensor | None
    spec: KVQuantSpec
    shape: tuple
    dtype: torch.dtype
    codebook: torch.Tensor | None = None
    smooth: torch.Tensor | None = None
    out_idx: torch.Tensor | None = None
    out_val: torch.Tensor | None = None
    perm: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        """Bytes stored: codes + scales + zeros + outlier slots (+ 4 for a tensor scale, + 4 per calibrated level)."""
        n = self.codes.numel() + (4 * self.codebook.numel() if self.codebook is not None else 0)
        for t in (self.scales, self.zeros, self.out_idx, self.out_val):
            if t is not None:
                n += t.numel() * t.element_size()
        return n + (4 if self.tensor_scale is not None else 0)

    def to(self, device) -> "QTensor":
        mv = lambda t: None if t is None else t.to(device)  # noqa: E731
        return QTensor(self.codes.to(device), mv(self.scales), mv(self.zeros), mv(self.tensor_scale),
                       self.spec, self.shape, self.dtype, mv(self.codebook), mv(self.smooth), mv(self.out_idx),
                       mv(self.out_val), mv(self.perm))
