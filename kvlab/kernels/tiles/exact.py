"""Exact float32 helpers for Triton kernels: IEEE rounding modes and narrow-float encoders.

The oracle (`kvlab.quant`) rounds with torch on the CPU; a kernel must reproduce those bits on
the GPU *and* under `TRITON_INTERPRET=1`. Triton's own casts are not usable for that: the
interpreter truncates fp32 -> bf16 and rounds fp32 -> fp16/fp8 half-up, and on the GPU a cast's
NaN payload differs from torch's. So every narrowing here is integer arithmetic on the float's
bits plus exact float ops (power-of-two scaling, the 2^23 round-to-even trick), which give the
same bits on every backend. Kernels using these must be launched with `enable_fp_fusion=False`
(a fused multiply-add would skip a rounding the oracle does). On NVIDIA, Triton lowers floor/ceil
to `cvt.rmi/rpi.ftz`, flushing subnormal inputs; the floors and ceils here only see non-negative
values, integers +- 0.5 or float64, where the flush cannot change a result.

This module imports Triton; only Triton backends (`triton.py`) and other tiles import it.
"""
from __future__ import annotations

import triton
import triton.language as tl

MAGIC = tl.constexpr(8388608.0)  # 2^23: adding it to 0 <= a < 2^23 leaves a rounded to an integer, ties to even


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@triton.jit
def as_f32(x):
    """x as float32, exactly: bf16 by its bits (the interpreter's bf16 -> fp32 cast mangles subnormals;
    on the GPU this is the same shift the cast compiles to)."""
    if x.dtype == tl.bfloat16:
        return (x.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.float32)


@triton.jit
def pow2(k):
    """2^k as float32 for int32 k in [-126, 127] (built from bits, exact)."""
    return ((k + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def rint_even(v):
    """Round half to even (torch.round), float32 -> float32; |v| >= 2^23, inf, NaN pass through."""
    a = tl.abs(v)
    r = tl.where(a < MAGIC, (a + MAGIC) - MAGIC, a)
    return tl.where(v < 0, -r, r)


@triton.jit
def rint_i32_hw(v):
    """int32 round half to even of float32 v by the GPU's `cvt.rni.s32.f32` (one instruction): NaN -> 0, out of
    range saturates to the int32 extremes. NVIDIA GPUs only (inline PTX: never on the interpreter, whose callers
    take `rint_even`); equal to `rint_even(v).to(int32)` wherever that is in range."""
    return tl.inline_asm_elementwise("cvt.rni.s32.f32 $0, $1;", "=r,r", [v], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def round_away(v):
    """Round half away from zero exactly as kvlab.quant.formats.roundf_away (C roundf)."""
    a = tl.abs(v)
    f = tl.floor(a)
    r = f + tl.floor(2.0 * (a - f))  # >= 0, or NaN (v NaN or inf, as in the oracle)
    # sign(v) * r as copysign: equal up to the sign of a zero, which no caller can see (codes add an
    # offset or clamp at 0); one LOP3 instead of two compares, two selects and a multiply
    return (r.to(tl.int32, bitcast=True) | (v.to(tl.int32, bitcast=True) & -2147483648)).to(tl.float32, bitcast=True)


@triton.jit
def trunc(v):
    """Round toward zero (torch.trunc)."""
    return tl.where(v < 0, tl.ceil(v), tl.floor(v))


@triton.jit
def narrow_float(v, M: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, WIDTH: tl.constexpr,
                 NAN_CODE: tl.constexpr):
    """Round float32 v to nearest-even in a binary float with M mantissa bits, smallest normal
    exponent EMIN and largest exponent EMAX (subnormals kept) -> (value float32, bits int32).

    Overflow gives inf (code exponent all ones, mantissa 0): callers of formats without inf
    (e4m3fn, e5m2 saturating) clamp first. NaN -> NAN_CODE with v's sign bit, as torch (c10) does.
    Codes: sign << (WIDTH - 1) | (eb - EMIN) << M + n, where n = rint(|v| / 2^(eb - M)) and
    eb = max(exponent(v), EMIN): one formula for subnormals, normals and the carry into the next
    binade.
    """
    bits = v.to(tl.int32, bitcast=True)
    neg = bits < 0
    a = tl.abs(v)
    e = ((bits >> 23) & 0xFF) - 127  # floor(log2 a) for normal a; -127 for zero and fp32 subnormals
    eb = tl.maximum(e, EMIN)
    n = a * pow2(M - eb)  # exact power-of-two scaling: [0, 2^(M+1)) for finite a
    n = tl.where(n < MAGIC, (n + MAGIC) - MAGIC, n)  # ties to even
    r = n * pow2(eb - M)
    ok = (eb < EMAX) | ((eb == EMAX) & (n < (1 << (M + 1))))  # finite after rounding (NaN, inf: False)
    ni = tl.where(ok, n, 0.0).to(tl.int32)
    code = tl.where(ok, ((eb - EMIN) << M) + ni, (EMAX - EMIN + 2) << M)
    code = tl.where(v != v, NAN_CODE, code)
    code = code | tl.where(neg, 1 << (WIDTH - 1), 0)
    val = tl.where(ok, r, float("inf"))
    val = tl.where(neg, -val, val)
    val = tl.where(v != v, v, val)
    return val, code


@triton.jit
def bf16_round(v):
    """float32 -> bfloat16 round to nearest even -> (value float32, bits int32 in [0, 0xFFFF]).
    NaN -> 0x7FC0 (c10's scalar conversion; torch's vectorized CPU path writes 0xFFFF)."""
    bits = v.to(tl.int32, bitcast=True)
    r = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
    r = tl.where(v != v, 0x7FC0, r)
    val = (r << 16).to(tl.float32, bitcast=True)
    return tl.where(v != v, v, val), r


@triton.jit
def e8m0(s, ELEM_INT: tl.constexpr):
    """kvlab.quant.formats.store_scale(s, "e8m0") -> (value float32, biased exponent int32).

    Int elements round the exponent up (2^ceil(log2 s)); fp elements take OCP MX's floor(log2 s)
    with log2 evaluated in float64 and rounded to float32 (as the oracle does). 0 -> 0, non-finite
    -> 255 (value NaN).
    """
    a = tl.abs(s)
    pos = a > 0
    l2 = tl.log2(tl.where(pos, a, 1.0).to(tl.float64))
    if ELEM_INT:
        e = tl.ceil(l2).to(tl.float32)
    else:
        e = tl.floor(l2.to(tl.float32))
    e = tl.where(pos, e + 127.0, 0.0)
    e = tl.where(a < float("inf"), tl.minimum(tl.maximum(e, 0.0), 254.0), 255.0)
    ei = e.to(tl.int32)
    val = tl.where(ei > 0, ei << 23, 0x00400000).to(tl.float32, bitcast=True)  # e = 0: 2^-127 (subnormal)
    return tl.where(ei == 255, float("nan"), val), ei


@triton.jit
def encode_scale(s, SDT: tl.constexpr, ELEM_INT: tl.constexpr):
    """Raw float32 scales -> (stored value as float32, stored bits in the page's storage type).
    SDT: 0 f16 (int16 bits), 1 bf16 (int16 bits), 2 f32, 3 e8m0 (uint8), 4 e4m3 saturating (uint8)."""
    if SDT == 0:
        v, c = narrow_float(s, 10, -14, 15, 16, 0x7E00)
        c = c.to(tl.int16)
    elif SDT == 1:
        v, c = bf16_round(s)
        c = c.to(tl.int16)
    elif SDT == 2:
        v = s
        c = s
    elif SDT == 3:
        v, c = e8m0(s, ELEM_INT)
        c = c.to(tl.uint8)
    else:  # e4m3, saturating (NVFP4 group scales)
        v, c = narrow_float(tl.where(s > 448.0, 448.0, tl.where(s < -448.0, -448.0, s)), 3, -6, 8, 8, 0x7F)
        c = c.to(tl.uint8)
    return v, c
