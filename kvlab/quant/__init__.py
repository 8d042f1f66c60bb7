"""kvlab.quant: the PyTorch oracle (scales, quantize, pack, dequantize, rotations, fp formats, engine bytes)."""
from .calibrated import fit_codebook
from .encode import block_bytes, decode_bytes, encode
from .oracle import dequantize, fake_quantize, quantize
from .permutation import fit_permutation
from .qtensor import QTensor
from .rotation import hadamard, rotate, unrotate
from .smoothing import fit_smoothing

__all__ = ["quantize", "dequantize", "fake_quantize", "encode", "decode_bytes", "block_bytes", "QTensor", "hadamard", "rotate", "unrotate",
           "fit_codebook", "fit_smoothing", "fit_permutation"]
