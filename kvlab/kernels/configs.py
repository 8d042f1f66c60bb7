"""Typed kernel configs: one frozen dataclass per kernel, validated on construction.

    TritonDecodeConfig(block_n=64, num_warps=4, num_splits=4)      # the Triton split-K decode
    GluonDecodeConfig(tokens_per_warp=32, maxnreg=168)             # the Gluon MMA-fragment decode
    ExtendConfig(block_m=64, block_n=32)                           # the Triton extend (chunked prefill)
    StoreConfig(block_r=16, num_warps=4)                           # the store kernel

`to_dict()` writes {"version", "kernel", fields...}; `config_from_dict(op, d)` reads it back, and also
the unversioned dicts of tuned files written before version 1 ("BLOCK_N", "ot", ...). The tuned-config
store (`tuned.py`) and `decode(config=...)` / `extend(config=...)` / `store(config=...)` take these or
their dicts. No Triton import.

Also which spec the store kernel is launched with (`store_kernel_spec`): a rotated spec (`rot=had`) as it is where
the kernel runs the rotation itself (`fuses_rotation`); otherwise the tokens are rotated by
`kvlab.quant.rotation.rotate` before the launch and the kernel sees the spec without its rotation. Tuned store configs
are keyed by that spec, so the store call, `tune()`, the sweep's speed stage and the benchmarks name the same entry.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, fields
from typing import ClassVar

from ..quant.rotation import hadamard_block
from .checks import need as _check
from .env import num_sms

VERSION = 1
DOTS = ("fp32", "bf16", "fp16", "fma")  # score / PV dot: fp32 (ieee), bf16 / fp16 tensor cores, fp32 FMAs
_LEGACY = {"BLOCK_N": "block_n", "BLOCK_M": "block_m", "BLOCK_R": "block_r", "ot": "transpose_o"}


def _pow2_in(name: str, v, lo: int, hi: int) -> None:
    _check(isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi and v & (v - 1) == 0,
           f"{name}={v!r}; allowed: a power of two in [{lo}, {hi}]")


def _opt_int(name: str, v, lo: int, hi: int) -> None:
    _check(v is None or (isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi),
           f"{name}={v!r}; allowed: None or an int in [{lo}, {hi}]")


def _one_of(name: str, v, allowed) -> None:
    _check(v in allowed, f"{name}={v!r}; allowed: {', '.join(map(repr, allowed))}")


class _Config:
    kernel: ClassVar[str]
    op: ClassVar[str]

    def __init_subclass__(cls, op: str = "", kernel: str = "triton", **kw):
        super().__init_subclass__(**kw)
        cls.op, cls.kernel = op, kernel

    def _check_launch(self) -> None:
        """Validate the launch options the Triton kernels share (warps, pipeline stages)."""
        _pow2_in("num_warps", self.num_warps, 1, 16)
        _check(isinstance(self.num_stages, int) and 1 <= self.num_stages <= 6,
               f"num_stages={self.num_stages!r}; allowed: an int in [1, 6]")

    def to_dict(self) -> dict:
        """{"version", "kernel", every field}: JSON-ready, read back by `config_from_dict`."""
        return {"version": VERSION, "kernel": self.kernel, **asdict(self)}

    def replace(self, **kw):
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **kw)


@dataclass(frozen=True)
class TritonDecodeConfig(_Config, op="decode"):
    """The Triton split-K decode (`decode/triton.py`).

    block_n: tokens per tile; num_warps, num_stages: launch options; num_splits: split-K count (None: from
    B x Hk, `auto_splits`); asm: inline-PTX fp16 fast paths where the spec has one (GPU only); dot: the
    dots' input precision (None: fp32 under the interpreter, bf16 on the GPU, fp16 after a fast path);
    layout: "operand" (dequantize in the dot's operand layout) or "rowfirst" (in the load's row layout,
    then through shared memory); orient: "q" (scores = q K^T) or "kv" (scores^T = K q^T, the big tiles on
    the MMA's M side); maxnreg: register cap per thread (None: the compiler's choice)."""
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    num_splits: int | None = None
    asm: bool = True
    dot: str | None = None
    layout: str = "operand"
    orient: str = "q"
    maxnreg: int | None = None

    def __post_init__(self):
        _pow2_in("block_n", self.block_n, 16, 256)
        self._check_launch()
        _opt_int("num_splits", self.num_splits, 1, 256)
        _check(isinstance(self.asm, bool), f"asm={self.asm!r}; allowed: True, False")
        _one_of("dot", self.dot, (None, *DOTS))
        _one_of("layout", self.layout, ("operand", "rowfirst"))
        _one_of("orient", self.orient, ("q", "kv"))
        _check(not (self.orient == "kv" and self.dot == "fma"),
               "orient='kv' runs tensor-core dots; it does not combine with dot='fma'")
        _opt_int("maxnreg", self.maxnreg, 32, 255)


@dataclass(frozen=True)
class GluonDecodeConfig(_Config, op="decode", kernel="gluon"):
    """The Gluon MMA-fragment decode (`decode/gluon.py`).

    num_warps: warps per program (each owns tokens_per_warp tokens of every tile); tokens_per_warp: 16 or
    32; num_splits: split-K count (None: `auto_splits`); maxnreg: register cap (more CTAs per SM);
    transpose_o: accumulate O^T = V^T P^T (heads in the MMA's N = 8 columns) instead of O = P V;
    fused_merge: with splits, the last program of each (sequence, KV head) to finish merges them (one launch),
    else a separate merge kernel runs (the default: on the H200 the fused merge was 7-15% slower at batch 1 with 33
    splits and 11% faster at batch 32 x 1K with 3, sweeps/results/h200/runs/fused-f257f7d); prefetch: load the next
    tile's code words before the current tile's math (a register prefetch); None: `gluon.prefetches` decides (on,
    except where two tiles of codes and scales leave no registers: channel-axis int4 / int3 keys at head_dim 256);
    unroll: with the prefetch, the tile loop unrolled by two so the two tiles' code registers swap roles instead of
    being copied each tile (offline sm_90: q4_0 441 -> 405 loop instructions a tile, 147 -> 168 registers;
    benchmarks/NOTES_decode.md, session 23; off until the H200 times it). It needs the prefetch (not prefetch=False);
    with prefetch=None it applies where `gluon.prefetches` turns the prefetch on and is ignored elsewhere.
    l2_prefetch: 0 (off), or n > 0: each tile also asks L2 for the code / scale / zero lines of the tile n tiles ahead
    of its load (`prefetch.global.L2`, one line a lane: registers for the lines' addresses, none for the data), so a
    loop whose loads wait on DRAM latency (few programs an SM: batch 1) finds them in L2 (off until the H200 times it;
    ignored where a warp tile would cross a page mid-tile: `gluon.l2_parts`).
    scores_t: the scores transposed, S^T = K Q^T, with the tile's tokens in the MMA's 16 rows and the GQA group's
    heads in its 8 columns, instead of S = Q K^T with the heads padded to 16 rows: half the score MMAs and no
    padded query registers, for a transposition of P in registers (True needs transpose_o; applies to GQA groups of
    up to 8 and is ignored for larger ones); None: the kernel's default (`gluon.SCORES_T`: on, as the H200 timed it
    faster for most schemes; KVLAB_GLUON_SCORES_T=0 turns it off)."""
    num_warps: int = 4
    tokens_per_warp: int = 16
    num_splits: int | None = None
    maxnreg: int | None = None
    transpose_o: bool = True
    fused_merge: bool = False
    prefetch: bool | None = None
    unroll: bool = False
    l2_prefetch: int = 0
    scores_t: bool | None = None

    def __post_init__(self):
        _one_of("num_warps", self.num_warps, (1, 2, 4, 8))
        _check(isinstance(self.l2_prefetch, int) and not isinstance(self.l2_prefetch, bool)
               and 0 <= self.l2_prefetch <= 8, f"l2_prefetch={self.l2_prefetch!r}; allowed: an int in [0, 8]")
        _one_of("tokens_per_warp", self.tokens_per_warp, (16, 32))
        _check(isinstance(self.unroll, bool), f"unroll={self.unroll!r}; allowed: True, False")
        _check(self.scores_t is None or isinstance(self.scores_t, bool),
               f"scores_t={self.scores_t!r}; allowed: None, True, False")
        _check(not (self.scores_t and not self.transpose_o), "scores_t=True transposes the scores into the O^T "
               "accumulator's columns; it needs transpose_o=True")
        _check(not (self.unroll and self.prefetch is False), "unroll=True unrolls the prefetching loop; it needs "
               "prefetch=True or None (not False)")
        _check(self.prefetch is None or isinstance(self.prefetch, bool),
               f"prefetch={self.prefetch!r}; allowed: None, True, False")
        _opt_int("num_splits", self.num_splits, 1, 256)
        _opt_int("maxnreg", self.maxnreg, 32, 255)
        _check(isinstance(self.transpose_o, bool), f"transpose_o={self.transpose_o!r}; allowed: True, False")
        _check(isinstance(self.fused_merge, bool), f"fused_merge={self.fused_merge!r}; allowed: True, False")


@dataclass(frozen=True)
class ExtendConfig(_Config, op="extend"):
    """The Triton extend (`extend/triton.py`): block_m (query, head) rows and block_n tokens per tile."""
    block_n: int = 32
    block_m: int = 64
    num_warps: int = 4
    num_stages: int = 2
    dot: str | None = None

    def __post_init__(self):
        _pow2_in("block_n", self.block_n, 16, 256)
        _pow2_in("block_m", self.block_m, 1, 256)
        self._check_launch()
        _one_of("dot", self.dot, (None, *DOTS))


@dataclass(frozen=True)
class StoreConfig(_Config, op="store"):
    """The store kernel (`store/triton.py`): block_r rows (tokens, or channels for axis chan) per program; maxnreg:
    register cap per thread (None: the compiler's choice; a cap fits more programs an SM, whose loads are then in
    flight while others compute)."""
    block_r: int = 16
    num_warps: int = 4
    maxnreg: int | None = None

    def __post_init__(self):
        _pow2_in("block_r", self.block_r, 1, 1024)
        _pow2_in("num_warps", self.num_warps, 1, 16)  # one stage: no pipelined loop
        _opt_int("maxnreg", self.maxnreg, 32, 255)


CONFIGS = {("decode", "triton"): TritonDecodeConfig, ("decode", "gluon"): GluonDecodeConfig,
           ("extend", "triton"): ExtendConfig, ("store", "triton"): StoreConfig}


def config_from_dict(op: str, d) -> _Config:
    """A config for `op` ("decode", "extend", "store") from `d`: a config (returned as is), a dict of
    `to_dict()`, or an unversioned dict of older tuned files. Unknown keys and values raise ValueError."""
    if isinstance(d, _Config):
        _check(d.op == op, f"a {type(d).__name__} is not a config for {op!r}")
        return d
    _check(isinstance(d, dict), f"config must be a dict or a kernel config, got {type(d).__name__}")
    d = dict(d)
    version = d.pop("version", 0)
    _check(version in (0, VERSION), f"config version {version!r}; this kvlab reads versions 0 and {VERSION}")
    kernel = d.pop("kernel", None) or "triton"
    cls = CONFIGS.get((op, kernel))
    _check(cls is not None, f"config kernel={kernel!r} for {op!r}; allowed: "
           + ", ".join(repr(k) for o, k in CONFIGS if o == op))
    if version == 0:
        d = {_LEGACY.get(k, k): v for k, v in d.items()}
    names = {f.name for f in fields(cls)}
    extra = sorted(set(d) - names)
    _check(not extra, f"unknown {cls.__name__} keys {extra}; allowed: {sorted(names)}")
    return cls(**d)


T_BUCKETS = (256, 4096)  # store writes: up to 256 tokens (decode steps), up to 4096, more ("max": prefill chunks)


def t_bucket(tokens: int) -> str:
    """The bucket of a store of `tokens` tokens, as tuned configs and the store's autotuner key it: "256", "4096" or
    "max"."""
    return next((str(b) for b in T_BUCKETS if tokens <= b), "max")


def auto_splits(B: int, Hk: int, device=None, waves: int = 2, max_splits: int = 64) -> int:
    """Split count so that B * Hk * splits covers `waves` programs per SM; where that gives fewer than 4
    splits, up to 4 while the grid stays under 6 programs per SM (more resident programs hide the
    latency of the page loads; benchmarks/NOTES_decode.md has the measurements behind both numbers)."""
    sms = num_sms(device)
    n = max(1, B * Hk)
    s = math.ceil(waves * sms / n)
    if s < 4:
        s = max(s, min(4, math.ceil(6 * sms / n)))
    return max(1, min(max_splits, s))


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def fuses_rotation(spec, D: int) -> bool:
    """True when the kernel applies a rotated spec's Hadamard rotation itself: token rows (not axis chan) of a
    power-of-two head_dim 16..256 that is one Hadamard block, and power-of-two groups (unpadded tiles)."""
    if spec.rotation != "had" or spec.axis == "chan" or spec.is_float_storage:
        return False
    G = spec.group_size(D)
    return 16 <= D <= 256 and _pow2(D) and hadamard_block(D) == D and _pow2(G) and D % G == 0


def store_kernel_spec(spec, D: int):
    """The spec the store kernel is launched with for head_dim D (see the module docstring): without `smooth` /
    `perm` (the store receives keys already divided and permuted, `kvlab.quant.smoothing.unsmoothed`), and without
    its rotation where the kernel does not rotate."""
    from ..quant.smoothing import unsmoothed
    spec = unsmoothed(spec)
    if spec.rotation == "none" or fuses_rotation(spec, D):
        return spec
    return dataclasses.replace(spec, rotation="none")
