"""Element and scale number formats: codebooks, fp8 casts, scale dtypes (torch, CPU or GPU).

Everything here is elementwise and exact: it defines which float a stored byte means.
"""
from __future__ import annotations

import torch

# E2M1 (OCP MX fp4) in GGML's index order: 0..7 positive, 8..15 negative (index 8 is -0).
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
# NF4 (QLoRA, bitsandbytes): quantiles of N(0, 1) normalised to [-1, 1].
NF4 = (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
       -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
       0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
       0.7229568362236023, 1.0)
# IQ4_NL (llama.cpp kvalues_iq4nl): a non-linear int8 grid, scaled by an fp16 d.
IQ4NL = (-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0, 1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0)
# Lloyd-Max quantizers of N(0, 1) (Max 1960): the levels of least mean squared error for a Gaussian, in units of
# its standard deviation, ascending (`rule=rms` scales them by the group's RMS). After a random rotation the
# coordinates of a head vector are close to Gaussian whatever the data, so the grid needs no calibration
# (TurboQuant's codebook, without its 1-bit residual). Values: the fixed point of Lloyd's iteration
# (tests/quant/test_lloyd_max.py recomputes it with scipy), 8 significant digits.
LM2 = (-1.5104176, -0.45278003, 0.45278003, 1.5104176)
LM3 = (-2.1519457, -1.3439093, -0.75600528, -0.24509418, 0.24509418, 0.75600528, 1.3439093, 2.1519457)
LM4 = (-2.7325896, -2.0690172, -1.6180464, -1.2562312, -0.94234046, -0.65675912, -0.3880483, -0.12839503,
       0.12839503, 0.3880483, 0.65675912, 0.94234046, 1.2562312, 1.6180464, 2.0690172, 2.7325896)
CODEBOOKS = {"fp4_e2m1": E2M1, "nf4": NF4, "iq4nl": IQ4NL, "lm2": LM2, "lm3": LM3, "lm4": LM4}

FP8_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
FP8_MAX = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}
# Largest exponent of the element format (OCP MX shared-exponent rule: E = floor(log2 amax) - emax).
ELEM_EMAX = {"fp4_e2m1": 2, "fp8_e4m3": 8, "fp8_e5m2": 15}
FLOAT_STORAGE = {"bf16": torch.bfloat16, "fp16": torch.float16}


def codebook(fmt: str, device=None) -> torch.Tensor:
    """[2^bits] float32 values of a codebook format."""
    return torch.tensor(CODEBOOKS[fmt], dtype=torch.float32, device=device)


def uniform_levels(spec, device=None) -> torch.Tensor:
    """[2^bits] float32 code values of an int spec (0..2^b-1 asymmetric, -2^(b-1)..2^(b-1)-1 symmetric): the levels
    a calibrated int (`int<b>:cal`) starts its fit from, and holds when they are its table."""
    lo = 0 if not spec.sym else -(2 ** (spec.bits - 1))
    return torch.arange(lo, lo + 2 ** spec.bits, dtype=torch.float32, device=device)


def codebook16(fmt: str) -> tuple[float, ...]:
    """A codebook as the kernels' 16-entry table: smaller codebooks padded with copies of their last value
    (a nearest-value search that keeps the first index on ties never picks a pad; codes index the real part)."""
    cb = CODEBOOKS[fmt]
    return tuple(cb) + (cb[-1],) * (16 - len(cb))


def codebook_absmax(fmt: str) -> float:
    return max(abs(v) for v in CODEBOOKS[fmt])


def fp8_cast(v: torch.Tensor, fmt: str) -> torch.Tensor:
    """Saturating cast of float32 `v` to fp8 (round to nearest even); returns the uint8 bytes."""
    m = FP8_MAX[fmt]
    return v.clamp(-m, m).to(FP8_DTYPES[fmt]).view(torch.uint8)


def finite_amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| over the finite elements of x, float32 0-d (0 when there are none): what a default tensor scale
    is computed from, so one non-finite value cannot poison every group."""
    a = x.float().abs()
    return torch.where(torch.isfinite(a), a, torch.zeros_like(a)).amax() if a.numel() else a.new_zeros(())


def fp8_value(b: torch.Tensor, fmt: str) -> torch.Tensor:
    """float32 value of fp8 bytes `b` (uint8)."""
    return b.view(FP8_DTYPES[fmt]).to(torch.float32)


def roundf_away(v: torch.Tensor) -> torch.Tensor:
    """Round half away from zero, exactly as C's roundf (and GGML's np_roundf) in float32."""
    a = v.abs()
    f = torch.floor(a)
    return torch.sign(v) * (f + torch.floor(2 * (a - f)))


def floor_log2(a: torch.Tensor) -> torch.Tensor:
    """floor(log2(a)) for a > 0 as float32 log2 would give it (log2 in float64, rounded to float32)."""
    return torch.floor(torch.log2(a.double()).float())


# ---- scale dtypes -----------------------------------------------------------------------
def store_scale(s: torch.Tensor, dtype: str, *, elem_fmt: str = "int") -> torch.Tensor:
    """Round float32 scales `s` to their storage dtype; returns the stored tensor.

    f16 / bf16 / f32: IEEE casts (round to nearest even); a NaN is a positive quiet NaN (bf16 0x7FC0), as the store
      kernel writes it.
    e8m0: a uint8 biased exponent. For fp elements it is the OCP MX shared exponent
      floor(log2 s) (s already divided by the element's largest power of two); for int elements
      it rounds up, 2^ceil(log2 s), so no code overflows. Zero or non-finite -> byte 0 / 255.
    e4m3: saturating cast to float8_e4m3fn (NVFP4 group scales).
    """
    if dtype == "f16":
        return s.to(torch.float16)
    if dtype == "bf16":  # a NaN scale stored as the canonical 0x7FC0: torch's vectorized CPU cast writes 0xFFFF
        b = s.to(torch.bfloat16).view(torch.int16)  # and its scalar one 0x7FC0, so the bits followed tensor size and CPU
        return torch.where(torch.isnan(s), torch.tensor(0x7FC0, dtype=torch.int16, device=s.device), b).view(torch.bfloat16)
    if dtype == "f32":
        return s.to(torch.float32)
    if dtype == "e4m3":
        return s.clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    if dtype == "e8m0":
        a = s.abs().float()
        e = floor_log2(a) if elem_fmt != "int" else torch.ceil(torch.log2(a.double())).float()
        e = torch.where(a > 0, e + 127, torch.zeros_like(e))
        e = torch.where(torch.isfinite(a), e.clamp(0, 254), torch.full_like(e, 255))
        return e.to(torch.uint8)
    raise ValueError(f"unknown scale dtype {dtype!r}; allowed: f16, bf16, f32, e8m0, e4m3")


def scale_value(stored: torch.Tensor, dtype: str) -> torch.Tensor:
    """float32 value of stored scales (inverse of `store_scale`)."""
    if dtype == "e8m0":
        e = stored.to(torch.int32)
        v = torch.exp2((e - 127).float())
        return torch.where(e == 255, torch.full_like(v, float("nan")), v)
    return stored.to(torch.float32)


def scale_bytes(stored: torch.Tensor) -> torch.Tensor:
    """Stored scales as raw little-endian bytes [..., nbytes] (uint8)."""
    return stored.contiguous().view(torch.uint8).reshape(*stored.shape, -1)
