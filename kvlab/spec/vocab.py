"""The spec vocabulary: formats, axes, scale dtypes, rules, roundings, rotations, packings, and the
bit-plane split of sub-byte codes. Pure Python; every other spec module reads its names from here."""
from __future__ import annotations

FORMATS = ("int", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "nf4", "iq4nl", "lm2", "lm3", "lm4", "bf16", "fp16")
# Lloyd-Max codebooks for N(0, 1) (levels in units of the group RMS, `rule=rms`): the data-free grid for
# coordinates made Gaussian by a random rotation (TurboQuant without its 1-bit residual).
LLOYD_MAX = ("lm2", "lm3", "lm4")
CAL_INT_BITS = 4  # ints up to this width may take calibrated levels (`cal`): a 16-entry table, as the codebooks'
AXES = ("tok", "chan", "head", "tensor")
SCALE_DTYPES = ("f16", "bf16", "f32", "e8m0", "e4m3")
SCALE_RULES = ("absmax", "signed", "mse", "unit", "full", "rms")
ROUNDINGS = ("even", "away", "up")
ROTATIONS = ("none", "had")
PACKINGS = ("seq", "ggml")
GROUP_MIN, GROUP_MAX = 8, 256
# outlier slots (`out=N`): full-precision values kept per token vector, each an fp16 value + a uint8 channel index
OUTLIERS_MAX = 8
OUTLIER_SLOT_BYTES = 3

SCALE_BYTES = {"f16": 2, "bf16": 2, "f32": 4, "e8m0": 1, "e4m3": 1}
# Fixed bit width of the non-int formats.
FORMAT_BITS = {"fp8_e4m3": 8, "fp8_e5m2": 8, "fp4_e2m1": 4, "nf4": 4, "iq4nl": 4, "lm2": 2, "lm3": 3, "lm4": 4,
               "bf16": 16, "fp16": 16}
SPEC_VERSION = 1


def bit_planes(bits: int) -> tuple[int, ...]:
    """Power-of-two plane widths for a code of `bits` bits, lowest bits first.

    4 -> (4,), 5 -> (4, 1), 6 -> (4, 2), 3 -> (2, 1), 7 -> (4, 2, 1), 8 -> (8,).
    """
    planes, rest = [], bits
    for w in (8, 4, 2, 1):
        if rest >= w:
            planes.append(w)
            rest -= w
    return tuple(planes)
