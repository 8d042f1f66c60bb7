"""The PyTorch oracle: `quantize(x, spec) -> QTensor` and `dequantize(q)`.

Ground truth for every kernel. Vectorised over groups (no Python loop over tokens or blocks),
float32 arithmetic, CPU or GPU. GGML presets follow ggml-quants.c (through gguf's reference)
operation for operation so that `encode` is byte-exact.

Non-finite input: a NaN or Inf makes its own group's scale non-finite (or, for unit-scale
fp8, only that element's code NaN); the group's codes are defined (0 -> the zero code) and
the group dequantizes to NaN. Every other group is bit-identical to quantizing it alone.
"""
from __future__ import annotations

import torch

from ..spec import KVQuantSpec, as_spec
from .formats import (CODEBOOKS, ELEM_EMAX, FLOAT_STORAGE, FP8_MAX, codebook, codebook_absmax, finite_amax, fp8_cast,
                      fp8_value, roundf_away, scale_value, store_scale)
from . import outliers as _slots
from .packing import pack, unpack
from .qtensor import QTensor
from .rotation import rotate, unrotate

MSE_RATIOS = tuple(1.0 - 0.025 * i for i in range(21))  # clipping ratios 1.0 .. 0.5 searched by rule=mse


# ---- input checks and grouping ------------------------------------------------------------
def check_input(x, spec: KVQuantSpec) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point() or x.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise ValueError(f"x must be float32, float16 or bfloat16, got {x.dtype}")
    if x.dim() < (2 if spec.axis == "chan" else 1):
        raise ValueError(f"x must have rank >= {2 if spec.axis == 'chan' else 1} ([..., tokens, head_dim]) for axis "
                         f"{spec.axis}, got shape {tuple(x.shape)}")
    spec.check_head_dim(x.shape[-1])
    if spec.axis == "chan" and x.shape[-2] % spec.group:
        raise ValueError(f"axis chan quantizes whole groups of {spec.group} tokens; got {x.shape[-2]} tokens "
                         "(the cache keeps an unfinished group in full precision)")


def group(x: torch.Tensor, spec: KVQuantSpec) -> torch.Tensor:
    """x [..., T, D] -> groups [..., A, B, G] (the last dim shares one scale)."""
    D = x.shape[-1]
    G = spec.group_size(D)
    if spec.axis == "chan":
        T = x.shape[-2]
        return x.reshape(*x.shape[:-2], T // G, G, D).transpose(-1, -2)  # [..., T/G, D, G]
    return x.reshape(*x.shape[:-1], D // G, G)  # [..., T, D/G, G]


def ungroup(xg: torch.Tensor, spec: KVQuantSpec, shape) -> torch.Tensor:
    if spec.axis == "chan":
        xg = xg.transpose(-1, -2)
    return xg.reshape(shape)


def _reduce(xg: torch.Tensor, how: str, spec: KVQuantSpec) -> torch.Tensor:
    """Per-group statistic, keepdim [..., A, B, 1] (one value broadcast for axis tensor)."""
    flat = xg.reshape(-1) if spec.axis == "tensor" else xg
    if how == "amax":
        r = flat.abs().amax(-1, keepdim=True)
    elif how == "max":
        r = flat.amax(-1, keepdim=True)
    elif how == "min":
        r = flat.amin(-1, keepdim=True)
    elif how == "rms":  # in float64, rounded once: the Triton store sums in float64 too, in another order
        r = flat.double().pow(2).mean(-1, keepdim=True).sqrt().float()
    else:  # "ext": the signed element of largest magnitude (first one on ties, as numpy's argmax)
        r = flat.gather(-1, flat.abs().argmax(-1, keepdim=True))
    if how in ("max", "min"):  # GGML's loop keeps the first element equal to the extreme: the sign of a zero
        r = flat.gather(-1, (flat == r).to(torch.uint8).argmax(-1, keepdim=True))  # extreme (amax/amin: any zero)
    # a non-finite element makes its group's statistic NaN, so the group's scale (and zero) is NaN and the whole
    # group dequantizes to NaN: an inf must not saturate into a finite scale (e4m3 clamps, e8m0 caps), and
    # amax/argmax skip or mis-place NaN on some backends (branch-free: no device sync)
    r = torch.where((~torch.isfinite(flat)).any(-1, keepdim=True), torch.full_like(r, float("nan")), r)
    return r.reshape([1] * xg.dim()) if spec.axis == "tensor" else r


# ---- per-format code computation ------------------------------------------------------------
def _div(x: torch.Tensor, c: float) -> torch.Tensor:
    """x / c with IEEE division on every device (CUDA turns `tensor / python_number` into a
    multiplication by the reciprocal, which is not GGML's arithmetic)."""
    return x / torch.tensor(c, dtype=x.dtype, device=x.device)


def _static(scale, xg) -> torch.Tensor:
    return torch.as_tensor(scale, dtype=torch.float32, device=xg.device).reshape([1] * xg.dim())


def _quant_int(xg, spec: KVQuantSpec, ratio: float, scale=None, table=None):
    """Codes, stored scales and zeros of int groups; `table` (a calibrated int's levels, in code units): each value
    takes the nearest scaled level, |s * t_j - (x - m)| in float32, the first on ties (a NaN value: code 0)."""
    b = spec.bits
    if spec.sym:
        if scale is not None:
            s_raw = _static(scale, xg)
        elif spec.rule == "signed":
            s_raw = _div(_reduce(xg, "ext", spec) * ratio, -(2 ** (b - 1)))
        elif spec.rule == "full":  # FreeToken q4_0: the whole two's-complement range; +|x|max clips to 2^(b-1) - 1
            s_raw = _div(_reduce(xg, "amax", spec) * ratio, 2 ** (b - 1))
        else:
            s_raw = _div(_reduce(xg, "amax", spec) * ratio, 2 ** (b - 1) - 1)
        m_raw = None
    else:
        mx, mn = _reduce(xg, "max", spec), _reduce(xg, "min", spec)
        if not (isinstance(ratio, float) and ratio == 1.0):  # a float, or [R, 1, ...] ratios (mse search)
            c, h = (mx + mn) / 2, (mx - mn) / 2 * ratio
            mx, mn = c + h, c - h
        s_raw, m_raw = _div(mx - mn, 2 ** b - 1), mn
    s_st = store_scale(s_raw, spec.scale_dtype)
    m_st = None if m_raw is None else store_scale(m_raw, spec.scale_dtype)
    if table is not None:  # calibrated levels (no recip, offset binary): the nearest scaled level
        s_val = scale_value(s_st, spec.scale_dtype)
        num = xg if m_st is None else xg - scale_value(m_st, spec.scale_dtype)
        err = (s_val.unsqueeze(-1) * table.to(xg.device) - num.unsqueeze(-1)).abs()  # [..., G, 2^b]
        return err.argmin(-1).to(torch.uint8), s_st, m_st
    if spec.recip:  # GGML: multiply by the fp32 reciprocal of the unrounded scale
        inv = torch.where(s_raw == 0, torch.zeros_like(s_raw), 1.0 / s_raw)
        v = xg * inv if m_raw is None else (xg - m_raw) * inv
    else:  # divide by the scale as stored (FreeToken)
        s_val = scale_value(s_st, spec.scale_dtype)
        num = xg if m_st is None else xg - scale_value(m_st, spec.scale_dtype)
        v = torch.where(s_val == 0, torch.zeros_like(num), num / s_val)
    v = torch.nan_to_num(v, nan=0.0)
    off = 2 ** (b - 1) if spec.sym else 0
    if spec.rounding == "up":  # GGML: trunc(v + off + 0.5) in float32
        u = torch.trunc(v + (off + 0.5))
    elif spec.rounding == "away":
        u = roundf_away(v) + off
    else:
        u = torch.round(v) + off
    u = u.clamp(0, 2 ** b - 1).to(torch.uint8)
    if spec.sym and (b == 8 or spec.twos):  # two's complement (GGML q8_0, FreeToken): flip the offset's top bit
        u = u ^ (1 << (b - 1))
    return u, s_st, m_st


def _quant_fp8(xg, spec: KVQuantSpec, ratio: float, scale):
    # finite values past the range saturate; a non-finite input is NaN, never a saturated finite code
    nan_if_bad = (lambda v: torch.where(torch.isfinite(xg), v, torch.full_like(v, float("nan"))))  # noqa: E731
    if not spec.has_scale:
        return fp8_cast(nan_if_bad(xg), spec.fmt), None, None
    if scale is not None:
        s_raw = _static(scale, xg)
    elif spec.scale_dtype == "e8m0":
        s_raw = _div(_reduce(xg, "amax", spec) * ratio, 2 ** ELEM_EMAX[spec.fmt])
    else:
        s_raw = _div(_reduce(xg, "amax", spec) * ratio, FP8_MAX[spec.fmt])
    s_st = store_scale(s_raw, spec.scale_dtype, elem_fmt=spec.fmt)
    s_val = scale_value(s_st, spec.scale_dtype)
    v = torch.where(s_val == 0, torch.zeros_like(xg), xg / s_val)
    return fp8_cast(nan_if_bad(v), spec.fmt), s_st, None


def _quant_codebook(xg, spec: KVQuantSpec, ratio: float, ts, table=None):
    cb = codebook(spec.fmt, xg.device) if table is None else table.to(xg.device)  # [2^bits]
    if spec.rule == "signed":
        s_raw = _reduce(xg, "ext", spec) * ratio / cb.min()
    elif spec.rule == "rms":  # Lloyd-Max levels are in RMS units
        s_raw = _reduce(xg, "rms", spec) * ratio
    elif spec.scale_dtype == "e8m0":
        s_raw = _div(_reduce(xg, "amax", spec) * ratio, 2 ** ELEM_EMAX.get(spec.fmt, 0))
    else:
        s_raw = _div(_reduce(xg, "amax", spec) * ratio, codebook_absmax(spec.fmt))
    if ts is not None:
        s_raw = s_raw / ts
    s_st = store_scale(s_raw, spec.scale_dtype, elem_fmt=spec.fmt)
    s_val = scale_value(s_st, spec.scale_dtype) * (1.0 if ts is None else ts)
    err = (s_val.unsqueeze(-1) * cb - xg.unsqueeze(-1)).abs()  # [..., G, 16]
    return err.argmin(-1).to(torch.uint8), s_st, None


def _values(u, s_st, m_st, spec: KVQuantSpec, ts, table=None):
    """Dequantized float32 group values from unpacked codes u [..., G] and stored scales
    (s_st, m_st broadcastable to u: [..., 1] per group or one value); `table`: a calibrated codebook's levels."""
    if spec.fmt == "int" and table is not None:  # a calibrated int: its levels, indexed by the code
        c = table.to(u.device)[u.long()]
    elif spec.fmt == "int":
        b = spec.bits
        if spec.sym:
            c = u.view(torch.int8).float() if b == 8 else (u ^ (1 << (b - 1)) if spec.twos else u).float() - 2 ** (b - 1)
        else:
            c = u.float()
    elif spec.fmt in FP8_MAX:
        c = fp8_value(u, spec.fmt)
    else:
        c = (codebook(spec.fmt, u.device) if table is None else table.to(u.device))[u.long()]
    if s_st is None:
        return c
    s = scale_value(s_st, spec.scale_dtype)  # keepdim: broadcasts over the group
    if ts is not None:
        s = s * ts
    if m_st is None:
        return c * s
    return c * s + scale_value(m_st, spec.scale_dtype)


# ---- public API ------------------------------------------------------------------------------
def quantize(x: torch.Tensor, spec, *, scale=None, tensor_scale=None, codebook=None, smooth=None,
             perm=None) -> QTensor:
    """Quantize x [..., T, D] (float32/16/bf16, any device) with `spec` -> `QTensor`.

    `scale` fixes the static scale of an axis-tensor spec (calibrated, as vLLM's k_scale);
    `tensor_scale` fixes NVFP4's fp32 second-level scale (default: amax / (6 * 448) of x);
    `codebook` gives a calibrated spec's (`cal`) levels: float [2^bits] (`fit_codebook`), required for it;
    `smooth` gives a smoothed spec's factors (`smooth`), positive, broadcastable to x (e.g. [Hk, 1, D] for
    x [Hk, T, D]; `kvlab.quant.smoothing.fit_smoothing`), required for it: the codes are those of x / smooth and
    `dequantize` multiplies back (every other field, the static and tensor scales included, is of x / smooth);
    `perm` gives a permuted spec's channel order (`perm`), an integer tensor broadcastable to x whose last dim
    is a permutation of 0..D-1 (e.g. [Hk, 1, D]; `kvlab.quant.permutation.fit_permutation`), required for it:
    the codes are those of (x / smooth)[..., perm] and `dequantize` puts the channels back.
    """
    s, p = check_smooth(smooth, spec, x), check_perm(perm, spec, x)
    y = _stored(x, s, p)
    q = _quantize(y, spec, scale, tensor_scale, packed=True, table=codebook)
    q.smooth, q.perm = s, p
    return q


def fake_quantize(x: torch.Tensor, spec, *, scale=None, tensor_scale=None, codebook=None,
                  smooth=None, perm=None) -> torch.Tensor:
    """dequantize(quantize(x, spec)) without packing the codes (bit-identical, faster)."""
    s, p = check_smooth(smooth, spec, x), check_perm(perm, spec, x)
    y = _quantize(_stored(x, s, p), spec, scale, tensor_scale, packed=False, table=codebook)
    return _model_order(y, s, p).to(x.dtype)


def _stored(x, s, p):
    """x as a smoothed / permuted cache stores it: (x / s)[..., p], in x's dtype."""
    if s is not None:
        x = (x.float() / s).to(x.dtype)
    return x if p is None else torch.gather(x, -1, p.expand(x.shape))


def _model_order(y, s, p):
    """The inverse of `_stored` (float32 when smoothed)."""
    if p is not None:
        y = torch.empty_like(y).scatter_(-1, p.expand(y.shape), y)
    return y if s is None else y.float() * s


def _check_fits(t, x, name: str) -> None:
    """ValueError unless t broadcasts to x's shape without growing it."""
    try:
        full = torch.broadcast_shapes(tuple(t.shape), tuple(x.shape))
    except RuntimeError:
        raise ValueError(f"{name} of shape {tuple(t.shape)} do not broadcast to x {tuple(x.shape)}") from None
    if full != tuple(x.shape):
        raise ValueError(f"{name} of shape {tuple(t.shape)} would grow x {tuple(x.shape)}")


def check_rows(p: torch.Tensor, name: str = "perm") -> None:
    """ValueError unless every row of p's last dim (int64) holds each channel 0..D-1 exactly once."""
    D = p.shape[-1]
    if not torch.equal(p.sort(-1).values, torch.arange(D, device=p.device).expand(p.shape)):
        raise ValueError(f"{name}: every row must hold each channel 0..{D - 1} exactly once")


def check_perm(perm, spec, x) -> torch.Tensor | None:
    """A permuted spec's channel order as int64 on x's device, broadcastable to x: ValueError unless the spec
    permutes (then it is required) and each row of its last dim is a permutation of 0..D-1."""
    spec = as_spec(spec)
    if not spec.permute:
        if perm is not None:
            raise ValueError(f"perm= gives a key channel permutation; spec {spec} does not permute (add ':perm' to a "
                             "K spec)")
        return None
    if perm is None:
        raise ValueError(f"spec {spec} permutes its key channels: pass perm= (an integer tensor broadcastable to x, "
                         "e.g. [Hk, 1, D]; kvlab.quant.permutation.fit_permutation, or the pool's pages['perm'])")
    p = torch.as_tensor(perm)
    if p.is_floating_point() or p.is_complex() or p.dtype == torch.bool:
        raise ValueError(f"perm must be an integer tensor, got {p.dtype}")
    p = p.long().to(getattr(x, "device", "cpu"))
    D = x.shape[-1]
    if p.dim() == 0 or p.shape[-1] != D:
        raise ValueError(f"perm's last dim must be head_dim {D}, got shape {tuple(p.shape)}")
    _check_fits(p, x, "perm")
    check_rows(p)
    return p


def check_smooth(smooth, spec, x) -> torch.Tensor | None:
    """A smoothed spec's factors as float32 on x's device, broadcastable to x: ValueError unless the spec smooths
    (then they are required) and they are finite, positive and of a broadcastable shape."""
    spec = as_spec(spec)
    if not spec.smooth:
        if smooth is not None:
            raise ValueError(f"smooth= gives key smoothing factors; spec {spec} does not smooth (add ':smooth' to a "
                             "K spec)")
        return None
    if smooth is None:
        raise ValueError(f"spec {spec} smooths its keys: pass smooth= (positive factors broadcastable to x, e.g. "
                         "[Hk, 1, D]; kvlab.quant.smoothing.fit_smoothing, or the pool's pages['smooth'])")
    s = torch.as_tensor(smooth).float().to(getattr(x, "device", "cpu"))
    if not bool(torch.isfinite(s).all()) or not bool((s > 0).all()):
        raise ValueError("smooth factors must be finite and positive")
    _check_fits(s, x, "smooth factors")
    return s


def check_codebook(table, spec: KVQuantSpec) -> torch.Tensor:
    """A calibrated spec's level table as float32 [2^bits]: ValueError unless the spec is calibrated and the table
    is 2^bits finite levels, ascending (the last copies of a kernel table's padding are dropped)."""
    if not spec.calibrated:
        if table is not None:
            raise ValueError(f"codebook= gives calibrated levels; spec {spec} is not calibrated (add ':cal' to a "
                             "Lloyd-Max format or an int of 2..4 bits)")
        return None
    if table is None:
        raise ValueError(f"spec {spec} is calibrated (cal): pass its levels, codebook= float [{2 ** spec.bits}] "
                         "(kvlab.quant.fit_codebook, or the pool's pages['codebook'])")
    t = torch.as_tensor(table).reshape(-1)
    n = 2 ** spec.bits  # (16 at most: lm2..lm4, int2..int4)
    if t.numel() == 16 and n < 16:
        t = t[:n]  # a kernel table: the levels, then copies of the last one
    if t.numel() != n or not t.is_floating_point() or not bool(torch.isfinite(t).all()):
        raise ValueError(f"codebook for {spec} must be {n} finite float levels, got {tuple(t.shape)} {t.dtype}")
    t = t.float()
    if n > 1 and not bool((t[1:] > t[:-1]).all()):
        raise ValueError(f"codebook levels must be strictly ascending, got {t.tolist()}")
    return t


def _quantize(x: torch.Tensor, spec, scale, tensor_scale, packed: bool, table=None):
    spec = as_spec(spec)
    check_input(x, spec)
    table = check_codebook(table, spec)
    shape, dtype = tuple(x.shape), x.dtype
    if spec.is_float_storage:
        if not packed:
            return x.to(FLOAT_STORAGE[spec.fmt]).to(x.dtype)
        codes = x.to(FLOAT_STORAGE[spec.fmt]).contiguous().view(torch.uint8)
        return QTensor(codes.reshape(*shape[:-1], 1, -1), None, None, None, spec, shape, dtype)
    xf = x.float()
    if spec.rotation == "had":
        xf = rotate(xf)
    out_idx = out_val = None
    if spec.outliers:  # the slots leave the dense codes: their elements quantize as the mean of their group's rest
        out_idx, out_val, mask = _slots.select(xf, spec.outliers)
        xg = _slots.fill(group(xf, spec), group(mask, spec))
    else:
        xg = group(xf, spec)  # [..., A, B, G]
    ts = None
    if spec.tensor_scale:
        ts = torch.as_tensor(tensor_scale if tensor_scale is not None else
                             _div(finite_amax(xf), codebook_absmax(spec.fmt) * 448.0), dtype=torch.float32, device=x.device)
        ts = torch.where(ts > 0, ts, torch.ones_like(ts))  # all zero or all non-finite: 1.0

    def run(ratio):
        if spec.fmt == "int":
            return _quant_int(xg, spec, ratio, scale, table)
        if spec.fmt in FP8_MAX:
            return _quant_fp8(xg, spec, ratio, scale)
        return _quant_codebook(xg, spec, ratio, ts, table)

    if scale is not None and not (spec.static_scale and spec.sym and spec.fmt in ("int", *FP8_MAX)):
        raise ValueError("scale= fixes a static per-tensor scale; it needs a symmetric int or fp8 spec with axis "
                         "tensor and a scale rule")
    u, s_st, m_st = run(1.0)
    if spec.rule == "mse" and scale is None and spec.has_scale:  # a static scale leaves nothing to search
        u, s_st, m_st = _mse_search(run, xg, spec, ts, u, s_st, m_st, table=table)
    if not packed:
        y = ungroup(_values(u, s_st, m_st, spec, ts, table), spec, shape)
        if out_idx is not None:
            y = _slots.apply(y, out_idx, out_val)
        return (unrotate(y) if spec.rotation == "had" else y).to(dtype)
    squeeze = (lambda t: None if t is None else (t.reshape(()) if spec.axis == "tensor" else t.squeeze(-1)))
    return QTensor(pack(u, spec), squeeze(s_st), squeeze(m_st), ts, spec, shape, dtype, table,
                   out_idx=out_idx, out_val=out_val)


def _mse_search(run, xg, spec: KVQuantSpec, ts, u, s_st, m_st, budget: int = 1 << 27, table=None):
    """rule=mse: per group (or per tensor), the clipping ratio in MSE_RATIOS with the least squared
    error, the first one on ties (same result as trying them one by one). Ratios are evaluated
    several at a time as a leading batch dimension [R, ...] (one set of kernels per chunk, not per
    ratio); R is chosen so the chunk's largest temporary (a codebook's [.., G, 16] distance table)
    stays within `budget` float32 values."""
    tensor = spec.axis == "tensor"
    best = ((_values(u, s_st, m_st, spec, ts, table) - xg) ** 2).sum(-1, keepdim=True)  # [..., A, B, 1]
    if tensor:
        best = best.sum()
    rest = MSE_RATIOS[1:]
    per_ratio = xg.numel() * (16 if spec.fmt in CODEBOOKS else 4)
    chunk = max(1, min(len(rest), budget // max(1, per_ratio)))
    for i in range(0, len(rest), chunk):
        r = torch.tensor(rest[i:i + chunk], dtype=torch.float32, device=xg.device).view(-1, *[1] * xg.dim())
        u2, s2, m2 = run(r)                                                  # [R, ..., A, B, G]
        err = ((_values(u2, s2, m2, spec, ts, table) - xg) ** 2).sum(-1, keepdim=True)  # [R, ..., A, B, 1]
        if tensor:
            tot = torch.stack([e.sum() for e in err])  # [R]; each summed as the one-by-one search sums it
            j = int(tot.argmin())                                            # first minimum
            if bool(tot[j] < best):
                best, u, s_st = tot[j], u2[j], s2[j]
                m_st = None if m2 is None else m2[j]
            continue
        e, j = err.min(0, keepdim=True)                                      # first minimum per group
        better = e[0] < best

        def pick(t2, t):
            t2 = t2.expand(err.shape[0], *t2.shape[1:]) if t2.shape[0] == 1 else t2
            idx = j.expand(1, *t2.shape[1:]) if t2.shape[-1] != 1 else j
            if t2.dtype.itemsize == 1 and t2.is_floating_point():  # fp8 scales (e4m3): gather their bytes
                got = t2.view(torch.uint8).gather(0, idx)[0].view(t2.dtype)
            else:
                got = t2.gather(0, idx)[0]
            return torch.where(better, got, t)
        u, s_st = pick(u2, u), pick(s2, s_st)
        m_st = None if m2 is None else pick(m2, m_st)
        best = torch.where(better, e[0], best)
    return u, s_st, m_st


def dequantize(q: QTensor) -> torch.Tensor:
    """Values of a `QTensor`: a tensor of the original shape and dtype."""
    spec = q.spec
    if spec.is_float_storage:
        return q.codes.reshape(*q.shape[:-1], -1).view(FLOAT_STORAGE[spec.fmt]).to(q.dtype)
    D = q.shape[-1]
    G = spec.group_size(D)
    u = unpack(q.codes, spec, G)  # [..., A, B, G]
    s = q.scales if q.scales is None or q.scales.dim() == 0 else q.scales.unsqueeze(-1)
    m = q.zeros if q.zeros is None or q.zeros.dim() == 0 else q.zeros.unsqueeze(-1)
    xg = _values(u, s, m, spec, q.tensor_scale, check_codebook(q.codebook, spec))
    x = ungroup(xg, spec, q.shape)
    if spec.outliers:
        _slots.check_slots(q.out_idx, q.out_val, spec, q.shape)
        x = _slots.apply(x, q.out_idx, q.out_val)
    if spec.rotation == "had":
        x = unrotate(x)
    return _model_order(x, q.smooth, q.perm).to(q.dtype)
