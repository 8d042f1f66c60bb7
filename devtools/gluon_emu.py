"""Run a Gluon kernel's own Python source on CPU torch tensors (Gluon has no interpreter).

`emulate(kernel)` returns a launcher that, like `kernel[grid](...)`, runs the kernel body once per
program id, with `ttgl` replaced by a torch-backed namespace: every op works on whole logical
tensors (layouts are ignored: Gluon's `convert_layout(..., assert_trivial=True)` and the compiler
guarantee that layouts only place elements, never change them), pointers are (flat tensor, offset
tensor) pairs, and `inline_asm_elementwise` executes the PTX text through a small interpreter of
the instructions the kvlab kernels use (mov, shr/shl, prmt (immediate or register selector), lop3, add/mul/fma
.f16x2, cvt e4m3x2, cvt f32 -> f16, mul.wide.s32); two tagged blocks with warp-level control flow run by their meaning
(`kvlab:warp-any`: a warp's vote, over the last axis here; `kvlab:rescale`: a product where a flag is set). What this
checks is
the kernel's index algebra, masking, softmax and merge logic and its PTX constants; what it cannot
check is the Gluon compiler or the hardware (the GPU tests do that).
"""
from __future__ import annotations

import re
import types

import numpy as np
import torch

# ---- a PTX interpreter for the inline asm of the kernels ------------------------------------------


def _f16x2(x: np.ndarray) -> np.ndarray:
    """uint32 registers -> [..., 2] float16 (low half first)."""
    return np.stack([(x & 0xFFFF).astype(np.uint16).view(np.float16), (x >> 16).astype(np.uint16).view(np.float16)], -1)


def _pack(h: np.ndarray) -> np.ndarray:
    lo = h[..., 0].astype(np.float16).view(np.uint16).astype(np.uint32)
    hi = h[..., 1].astype(np.float16).view(np.uint16).astype(np.uint32)
    return lo | (hi << 16)


def _prmt(a: np.ndarray, b: np.ndarray, sel) -> np.ndarray:
    """prmt.b32 default mode: byte i of the result = byte (sel nibble i & 7) of {b, a}; bit 3 = sign fill.
    `sel`: an immediate or a register (its low 16 bits, per element)."""
    a, b, sel = np.broadcast_arrays(*(np.asarray(x, dtype=np.uint32) for x in (a, b, sel)))
    pool = np.stack([(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)])
    out = np.zeros(a.shape, dtype=np.uint32)
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        byte = np.take_along_axis(pool, (nib & 7)[None].astype(np.int64), 0)[0]
        byte = np.where(nib & 8, np.where(byte & 0x80, 0xFF, 0), byte).astype(np.uint32)
        out |= byte << (8 * i)
    return out


def _lop3(a, b, c, lut: int) -> np.ndarray:
    out = np.zeros_like(a)
    for bit in range(8):  # truth table index: a=0xF0, b=0xCC, c=0xAA
        if lut >> bit & 1:
            ta = a if bit & 4 else ~a
            tb = b if bit & 2 else ~b
            tc = c if bit & 1 else ~c
            out |= ta & tb & tc
    return out & 0xFFFFFFFF


def _e4m3_to_f16_bits() -> np.ndarray:
    """fp16 bit patterns of the 256 e4m3 codes (NaN codes -> the canonical fp16 NaN 0x7FFF, as the hardware)."""
    f = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float16)
    bits = f.view(torch.int16).numpy().view(np.uint16).copy()
    bits[torch.isnan(f).numpy()] = 0x7FFF
    return bits


def run_ptx(asm: str, constraints: str, args: list[np.ndarray]) -> list[np.ndarray]:
    """Execute `asm` (the subset above) elementwise on numpy arrays; 'r' operands are uint32, 'h' uint16."""
    kinds = [c.strip() for c in constraints.split(",")]
    outs = [k for k in kinds if k.startswith("=")]
    regs: dict[str, np.ndarray] = {}
    for i, (k, a) in enumerate(zip(kinds[len(outs):], args)):
        regs[f"${len(outs) + i}"] = a.astype(np.uint32)
    body = asm.strip().lstrip("{").rstrip("}")

    def val(tok: str):
        tok = tok.strip()
        if tok in regs:
            return regs[tok]
        if re.fullmatch(r"(0x[0-9A-Fa-f]+|\d+)", tok):
            return np.uint32(int(tok, 0))
        raise ValueError(f"emulated PTX: unknown operand {tok!r} in {asm!r}")
    for stmt in body.split(";"):
        stmt = stmt.strip()
        if not stmt or stmt.startswith(".reg"):
            continue
        op, rest = stmt.split(None, 1)
        m = re.fullmatch(r"\{\s*(\S+)\s*,\s*(\S+)\s*\}\s*,\s*(\S+)", rest)
        if op == "mov.b32" and m:  # unpack a 32-bit register into two 16-bit ones
            src = val(m.group(3))
            regs[m.group(1)], regs[m.group(2)] = src & 0xFFFF, src >> 16
            continue
        ops = [x.strip() for x in re.split(r",(?![^{]*\})", rest)]
        dst = ops[0]
        if op == "mov.b32":
            m2 = re.fullmatch(r"\{\s*(\S+)\s*,\s*(\S+)\s*\}", ops[1])
            regs[dst] = (val(m2.group(1)) & 0xFFFF) | ((val(m2.group(2)) & 0xFFFF) << 16) if m2 else val(ops[1])
        elif op == "prmt.b32":
            regs[dst] = _prmt(val(ops[1]), val(ops[2]), val(ops[3]))
        elif op in ("mov.b16", "cvt.u16.u32"):
            regs[dst] = val(ops[1]) & 0xFFFF
        elif op == "cvt.rn.f16.f32":  # the source register's bits as float32, rounded to fp16 bits
            f = np.asarray(val(ops[1]), dtype=np.uint32).view(np.float32)
            with np.errstate(over="ignore"):
                regs[dst] = f.astype(np.float16).view(np.uint16).astype(np.uint32)
        elif op in ("shr.b32", "shr.u32"):
            regs[dst] = (val(ops[1]) >> int(ops[2], 0)) & 0xFFFFFFFF
        elif op in ("shl.b32", "shl.u32"):
            regs[dst] = (val(ops[1]) << int(ops[2], 0)) & 0xFFFFFFFF
        elif op == "cvt.rn.f16x2.e4m3x2":  # low byte -> low half
            src = val(ops[1]).astype(np.uint32)
            lut = _e4m3_to_f16_bits()
            regs[dst] = lut[src & 0xFF].astype(np.uint32) | (lut[(src >> 8) & 0xFF].astype(np.uint32) << 16)
        elif op == "mul.wide.s32":  # int64 product of two signed 32-bit registers (the 'l' result, as int64)
            a32 = np.asarray(val(ops[1])).astype(np.uint32).view(np.int32).astype(np.int64)
            b32 = np.asarray(val(ops[2])).astype(np.uint32).view(np.int32).astype(np.int64)
            regs[dst] = a32 * b32
        elif op == "lop3.b32":
            regs[dst] = _lop3(val(ops[1]), val(ops[2]), val(ops[3]), int(ops[4], 0))
        elif op in ("add.rn.f16x2", "mul.rn.f16x2", "fma.rn.f16x2", "sub.rn.f16x2"):
            x = [_f16x2(np.broadcast_to(val(o), np.shape(regs.get(ops[1], val(ops[1])))).astype(np.uint32))
                 for o in ops[1:]]
            with np.errstate(invalid="ignore", over="ignore"):  # NaN / inf scales are data here, not errors
                f = {"add.rn.f16x2": lambda a, b: a.astype(np.float32) + b, "sub.rn.f16x2": lambda a, b: a.astype(np.float32) - b,
                     "mul.rn.f16x2": lambda a, b: a.astype(np.float32) * b,
                     "fma.rn.f16x2": lambda a, b, c: a.astype(np.float64) * b + c}[op](*x)
            regs[dst] = _pack(f.astype(np.float16))
        else:
            raise ValueError(f"emulated PTX: instruction {op!r} is not supported")
    return [regs[f"${i}"] for i in range(len(outs))]


# ---- torch-backed ttgl ------------------------------------------------------------------------------
TRACE: list | None = None  # a list: loads and L2 prefetches are recorded in program order (`traced`)


def traced():
    """Within: every emulated load appends ("ld", byte addresses [n] int64, element bytes) to TRACE, every L2
    prefetch asm ("pf", addresses of its active lanes [n] int64, 0) and every program's start ("prog", its ids, 0), in
    program order."""
    import contextlib

    @contextlib.contextmanager
    def cm():
        global TRACE
        TRACE = []
        try:
            yield TRACE
        finally:
            TRACE = None
    return cm()


class Ptr:
    """A pointer tensor: flat storage + element offsets."""

    def __init__(self, flat: torch.Tensor, off=0):
        self.flat, self.off = flat, off
        self.dtype = types.SimpleNamespace(element_ty=flat.dtype)

    def __add__(self, o):
        return Ptr(self.flat, self.off + o)
    __radd__ = __add__

    def to(self, dtype, bitcast=False):
        """The pointer's byte address as an int64 tensor (Gluon's `ptr.to(int64, bitcast=True)`)."""
        assert dtype == torch.int64 and bitcast, "the emulator casts pointers only to int64 by bitcast"
        return torch.as_tensor(self.off, dtype=torch.int64) * self.flat.element_size() + self.flat.data_ptr()


def _t(x):
    return getattr(x, "value", x)


class _State:
    pid = (0, 0, 0)
    grid = (1, 1, 1)


def _namespace() -> types.SimpleNamespace:
    def arange(start, end, layout=None):
        return torch.arange(_t(start), _t(end))

    def _trace_ld(ptr, off, mask=None):
        if TRACE is not None:
            o = off.reshape(-1) if mask is None else off[mask]
            es = ptr.flat.element_size()
            TRACE.append(("ld", ptr.flat.data_ptr() + o.long().numpy() * es, es))

    def load(ptr, mask=None, other=None, **_):
        off = torch.as_tensor(ptr.off)
        if mask is None:
            _trace_ld(ptr, off)
            return ptr.flat[off.long()]
        mask = torch.as_tensor(mask)
        off, mask = torch.broadcast_tensors(off, mask)
        _trace_ld(ptr, off, mask)
        safe = torch.where(mask, off, torch.zeros_like(off)).long()
        v = ptr.flat[safe]
        return torch.where(mask, v, torch.as_tensor(other if other is not None else 0, dtype=v.dtype))

    def store(ptr, val, mask=None, **_):
        off = torch.as_tensor(ptr.off)
        val = torch.as_tensor(val).to(ptr.flat.dtype)
        m = torch.ones((), dtype=torch.bool) if mask is None else torch.as_tensor(mask)
        off, val, m = torch.broadcast_tensors(off, val, m)
        ptr.flat[off[m].long()] = val[m]

    def inline_asm_elementwise(asm, constraints, args, dtype, is_pure=True, pack=1):
        if "kvlab:warp-any" in _t(asm):  # a warp's vote over its lanes' alphas: here, over its row of heads
            a = torch.as_tensor(args[0])
            return (a != 1.0).any(-1, keepdim=True).expand(a.shape).to(torch.int32)
        if "kvlab:rescale" in _t(asm):  # the accumulator times alpha, where the warp's flag is set
            acc, alpha, flag = torch.broadcast_tensors(*args)
            return torch.where(flag != 0, acc * alpha, acc)
        assert _t(pack) == 1, "the emulator runs pack=1 asm only (and the tagged kvlab:warp-any / kvlab:rescale)"
        args = torch.broadcast_tensors(*args)
        if "prefetch.global" in _t(asm):  # a hint with no result: recorded ($1 address, $2 != 0 active)
            if TRACE is not None:
                TRACE.append(("pf", args[0][args[1] != 0].long().numpy(), 0))
            return torch.zeros(args[0].shape, dtype=torch.int32)
        np_args = []
        for a in args:
            if a.dtype in (torch.float16, torch.bfloat16):
                np_args.append(a.contiguous().view(torch.int16).numpy().view(np.uint16).astype(np.uint32))
            else:
                np_args.append(a.contiguous().numpy().astype(np.int64).astype(np.uint32))
        outs = run_ptx(_t(asm), _t(constraints), np_args)
        dts = dtype if isinstance(dtype, tuple) else (dtype,)
        res = []
        for o, dt in zip(outs, dts):
            if dt == torch.float16:
                res.append(torch.from_numpy((o & 0xFFFF).astype(np.uint16).view(np.float16).copy()))
            elif dt == torch.int64:
                res.append(torch.from_numpy(np.asarray(o).astype(np.int64).copy()))
            else:
                res.append(torch.from_numpy(o.astype(np.uint32).view(np.int32).copy()))
        return tuple(res) if isinstance(dtype, tuple) else res[0]

    def where(c, a, b):
        a, b = torch.as_tensor(a), torch.as_tensor(b)
        return torch.where(torch.as_tensor(c), a, b)

    def full(shape, value, dtype, layout=None):
        return torch.full([_t(s) for s in shape], value, dtype=dtype)

    def zeros(shape, dtype, layout=None):
        return torch.zeros([_t(s) for s in shape], dtype=dtype)

    def zeros_like(x, shape=None, dtype=None, layout=None):
        return torch.zeros_like(x) if shape is None and dtype is None else zeros(shape or x.shape, dtype or x.dtype)

    def atomic_add(ptr, val, mask=None, sem=None, scope=None):
        off = int(torch.as_tensor(ptr.off))
        old = ptr.flat[off].clone()
        ptr.flat[off] += val
        return old

    def atomic_xchg(ptr, val, mask=None, sem=None, scope=None):
        off = int(torch.as_tensor(ptr.off))
        old = ptr.flat[off].clone()
        ptr.flat[off] = val
        return old

    def mma_v2(a, b, acc, input_precision=None):
        return acc + torch.matmul(a.float(), b.float())

    ns = types.SimpleNamespace(
        constexpr=object, float16=torch.float16, bfloat16=torch.bfloat16, float32=torch.float32, int32=torch.int32,
        int64=torch.int64, int16=torch.int16, uint8=torch.uint8,
        SliceLayout=lambda *a, **k: None, DotOperandLayout=lambda *a, **k: None, DistributedLinearLayout=lambda *a, **k: None,
        NVMMADistributedLayout=lambda *a, **k: None, BlockedLayout=lambda *a, **k: None,
        program_id=lambda i: torch.tensor(_State.pid[i], dtype=torch.int32),
        num_programs=lambda i: torch.tensor(_State.grid[i], dtype=torch.int32),
        arange=arange, load=load, store=store, where=where, full=full, zeros=zeros, zeros_like=zeros_like,
        maximum=lambda a, b: torch.maximum(torch.as_tensor(a), torch.as_tensor(b)),
        minimum=lambda a, b: torch.minimum(torch.as_tensor(a), torch.as_tensor(b)),
        max=lambda x, axis: x.amax(_t(axis)), sum=lambda x, axis: x.sum(_t(axis)),
        exp2=torch.exp2, log2=torch.log2, cdiv=lambda a, b: (a + b - 1) // b,
        join=lambda a, b: torch.stack(torch.broadcast_tensors(a, b), -1),
        split=lambda x: (x[..., 0], x[..., 1]),
        permute=lambda x, order: x.permute(*[_t(o) for o in order]),
        reshape=lambda x, shape: x.reshape([_t(s) for s in shape]),
        expand_dims=lambda x, d: x.unsqueeze(_t(d)),
        broadcast=lambda a, b: torch.broadcast_tensors(a, b),
        convert_layout=lambda x, layout, assert_trivial=False: x,
        inline_asm_elementwise=inline_asm_elementwise, static_print=lambda *a: None, static_range=range,
        atomic_add=atomic_add, atomic_xchg=atomic_xchg, barrier=lambda **k: None, thread_barrier=lambda: None,
    )
    return ns, mma_v2


def _emulated(fn, cache: dict):
    """The raw Python function of a Gluon JIT function with ttgl / helpers / constexpr globals swapped."""
    raw = fn.fn
    if raw in cache:
        return cache[raw]
    ns, mma = cache["__ttgl__"]
    g = dict(raw.__globals__)
    for k, v in list(g.items()):
        if hasattr(v, "fn") and hasattr(v, "signature"):  # a (Gluon) JIT helper
            g[k] = None  # filled below, after the cache entry exists (recursion)
        elif type(v).__name__ == "constexpr":
            g[k] = v.value
    g["ttgl"], g["mma_v2"] = ns, mma
    f = types.FunctionType(raw.__code__, g, raw.__name__, raw.__defaults__, raw.__closure__)
    cache[raw] = f
    for k, v in raw.__globals__.items():
        if hasattr(v, "fn") and hasattr(v, "signature"):
            g[k] = _emulated(v, cache)
    return f


def _flat(a: torch.Tensor) -> torch.Tensor:
    """A 1-d view from a's first element spanning every element its strides reach (kernels index by strides)."""
    span = 1 + sum((n - 1) * st for n, st in zip(a.shape, a.stride()) if n > 0)
    return a.as_strided((span,), (1,))


def emulate(kernel):
    """-> an object whose [grid](*args, **constexprs) runs `kernel` on CPU tensors, program by program."""
    cache = {"__ttgl__": _namespace()}
    f = _emulated(kernel, cache)

    class _Launcher:
        def __getitem__(self, grid):
            grid = tuple(grid) + (1,) * (3 - len(grid))

            def run(*args, num_warps=4, maxnreg=None, **kw):  # launch options do not change results
                args = [Ptr(_flat(a)) if isinstance(a, torch.Tensor) and a.dim() > 0
                        else (a.item() if isinstance(a, torch.Tensor) else a) for a in args]
                kw = {k: _t(v) for k, v in kw.items()}
                _State.grid = grid
                for x in range(grid[0]):
                    for y in range(grid[1]):
                        for z in range(grid[2]):
                            _State.pid = (x, y, z)
                            if TRACE is not None:
                                TRACE.append(("prog", (x, y, z), 0))
                            f(*args, **kw)
            return run
    return _Launcher()
