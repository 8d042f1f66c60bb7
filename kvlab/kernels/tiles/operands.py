"""Host side of the Triton attention kernels: page tensors -> kernel operands, the dot mode, the
split-K merge launch (with the full-precision tokens attended beside it: `merge_with_fp`). Shared by the decode
and extend Triton backends and the Gluon decode."""
from __future__ import annotations

import functools
import math

import torch
import triton

from ...quant.formats import CODEBOOKS, codebook16
from ...quant.rotation import hadamard_block, norm_constant
from ..env import can_launch, interpreting
from .attention import fp_merge_kernel, merge_kernel
from .layout import tile_config
from .permute import perm_kind

HEAD_DIMS = (32, 64, 128, 256)  # power-of-two head dims the Triton kernels tile (tl.arange needs 2^k)
_UNIT = {4: torch.int32, 2: torch.int16, 1: torch.uint8}
DOT_MODES = {"fp32": 0, "bf16": 1, "fp16": 2, "fma": 3}
LOG2E = 1.4426950408889634  # the kernels run softmax in base 2: scores are scaled by sm_scale * log2(e)


@functools.lru_cache(maxsize=256)
def _tile(spec, D: int, word_max: int, asm: bool, device: str, rowfirst: bool = False):
    cfg, perm = tile_config(spec, D, word_max, asm, rowfirst)
    lut = (torch.tensor(codebook16(spec.fmt), dtype=torch.float32, device=device)
           if spec.fmt in CODEBOOKS and spec.fmt != "fp4_e2m1" else None)
    return cfg, torch.tensor(perm, dtype=torch.int32, device=device), lut, perm_kind(perm, D)


def page_operands(pages: dict, spec, D: int, asm: bool, device, tensor_scale, rowfirst: bool = False) -> dict:
    """Kernel arguments of one cache tensor: codes viewed in their widest load unit ("c"), scales ("s"),
    zeros ("z"), codebook ("lut": the format's, or a calibrated spec's pages["codebook"]), column permutation ("perm"),
    its (M, H) form ("pm", `tiles.permute.perm_kind`), per-tensor scale ("ts", float32 [1] or None), the TileCfg
    ("cfg"), code / scale strides ("cs", "ss"), and an `out=N` spec's outlier slots ("oi", "ov": pages["out_idx"] /
    ["out_val"], page / head strides "os"; dummies otherwise: `slot_args`)."""
    codes = pages["codes"]
    word, view = 4, codes
    if not spec.is_float_storage:
        while word > 1:
            try:
                view = codes.view(_UNIT[word])
                break
            except RuntimeError:
                word //= 2
    cfg, perm, lut, pm = _tile(spec, D, word, asm, str(device), rowfirst)
    if spec.calibrated:  # a calibrated codebook: the layer's own levels, kept beside its pages
        lut = pages["codebook"]
    if cfg.word != word and not spec.is_float_storage:
        view = codes.view(_UNIT[cfg.word])
    scales, zeros = pages.get("scales"), pages.get("zeros")
    if scales is not None and scales.dtype == torch.float8_e4m3fn:
        scales = scales.view(torch.uint8)  # e4m3 scales travel as bytes (bitcast in-kernel)
    ts = None if tensor_scale is None else torch.as_tensor(tensor_scale, dtype=torch.float32, device=device).reshape(1)
    cs = list(view.stride()) + [0] * (5 - view.dim())
    inner = view.shape[2:]  # within-page dims must be dense: the kernels take their strides as constexprs
    if any(view.stride(i) != math.prod(inner[i - 1:]) for i in range(2, view.dim())):
        raise ValueError(f"page codes must be contiguous within a (page, head) tile; got strides {view.stride()}")
    if scales is not None and (scales.stride(-1) != 1 or scales.stride(2) != math.prod(scales.shape[3:])):
        raise ValueError(f"page scales must be contiguous within a (page, head) tile; got strides {scales.stride()}")
    if zeros is not None and zeros.stride() != scales.stride():
        raise ValueError("zeros must have the same strides as scales")
    ss = list(scales.stride()) if scales is not None else [0, 0, 0]
    oi, ov, os_ = perm, perm, [0, 0]
    if spec.outliers:  # outlier slots [N, Hk, P, n], uint8 indices and fp16 values of the same strides
        oi, ov = pages["out_idx"], pages["out_val"]
        if oi.stride() != ov.stride() or oi.stride(-1) != 1 or oi.stride(2) != spec.outliers:
            raise ValueError(f"outlier slots must be contiguous within a (page, head) tile, out_idx and out_val alike; "
                             f"got strides {oi.stride()} and {ov.stride()}")
        os_ = [oi.stride(0), oi.stride(1)]
    return dict(c=view, s=perm if scales is None else scales, z=perm if zeros is None else zeros,
                lut=perm if lut is None else lut, perm=perm, pm=pm, ts=ts, cfg=tuple(cfg),
                cs=cs[:4] if cfg.chan else cs[:3] + [0], ss=ss[:3], half=bool(cfg.asm), oi=oi, ov=ov, os=os_)


def slot_args(K: dict, V: dict) -> tuple:
    """The outlier-slot kernel arguments of K's and V's page operands: (KSI, KSV, VSI, VSV, kso0, kso1, vso0, vso1)
    (dummies and zero strides for specs without slots; the kernels read them only where the cfg has slots)."""
    return K["oi"], K["ov"], V["oi"], V["ov"], *K["os"], *V["os"]


def dot_mode(cfg_dot: str | None, half: bool) -> int:
    """Config dot -> the kernels' DOT constexpr: "fma" (CUDA cores) when asked, fp16 tensor-core dots
    after an fp16 fast path (`half`), else the config's, else fp32 under the interpreter and bf16 on the GPU."""
    if cfg_dot == "fma":
        return DOT_MODES["fma"]
    if half:
        return DOT_MODES["fp16"]
    return DOT_MODES[cfg_dot or ("fp32" if interpreting() else "bf16")]


def fused_unrotation(D: int) -> int:
    """log2(D) where the merge kernels un-rotate a rotated-V output themselves (the Hadamard rotation of head_dim D is
    one power-of-two block: H symmetric, out H^T by the fast transform), else 0 (the caller multiplies by H^T)."""
    return D.bit_length() - 1 if D >= 8 and hadamard_block(D) == D else 0  # (a block is a power of two)


def merge_splits(op: torch.Tensor, lse: torch.Tensor, out: torch.Tensor, rotated: bool = False) -> None:
    """Merge split-K partials op [B, Hq, S, D] fp32 and their log2-sum-exps lse [B, Hq, S] into out [B, Hq, D].
    rotated: the partials are of v H (a rotated V spec) and out gets them un-rotated (needs `fused_unrotation(D)`)."""
    B, Hq, S, D = op.shape
    rot = fused_unrotation(D) if rotated else 0
    if rotated and not rot:
        raise ValueError(f"the merge does not un-rotate head_dim {D} (not one power-of-two Hadamard block)")
    merge_kernel[(B, Hq)](op, lse, out, S, out.stride(0), out.stride(1), SP=triton.next_power_of_2(S), D=D,
                          ROT=rot, RC=norm_constant(D) if rot else 1.0, num_warps=4)


def merge_with_fp(op: torch.Tensor, lse: torch.Tensor, q: torch.Tensor, k_fp: torch.Tensor, v_fp: torch.Tensor,
                  fp_len: torch.Tensor, sm_scale: float, out: torch.Tensor, v_rot: torch.Tensor | None = None) -> None:
    """out [B, Hq, D] = attention over a sequence's paged tokens, given as split partials op [B, Hq, S, D] fp32 with
    their log2-sum-exps lse [B, Hq, S], and its full-precision tokens k_fp / v_fp [B, Hk, W, D] (fp_len [B] used),
    attended here in fp32 from q [B, Hq, D] (the query in the full-precision tokens' space: not rotated).
    v_rot: `kvlab.quant.rotation.hadamard(D)` (H [D, D]) when the pages hold v H (the partials are then rotated;
    no other rotation is meant: the fused path applies H by its fast transform): out = part H^T +
    the full-precision part, H^T applied by the kernel's fast transform where H is one power-of-two block
    (`fused_unrotation`), else one addmm after it. One launch (plus the addmm): the paged kernel runs without the
    full-precision path, so it keeps its registers and its splits, and the window is never rotated. 64 tokens a
    block, 4 warps at head_dim 256, else 2: on the H200 (B 32, 36 tokens, 9 splits) Gemma's shape 5.1 us and
    SmolLM2's 4.0, against 9.5 and 5.7 at 16 / 32 tokens and 4 warps (runs/s14a-fixedcost/probe.csv)."""
    B, Hq, S, D = op.shape
    group = Hq // k_fp.shape[1]
    if fp_len.dtype != torch.int32:
        fp_len = fp_len.to(torch.int32)
    q, k_fp, v_fp = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k_fp, v_fp))
    rot = v_rot is not None
    fused = fused_unrotation(D) if rot else 0  # the kernel un-rotates the paged part itself (H one D-block)
    split = rot and not fused
    o = torch.empty((B, Hq, D), dtype=torch.float32, device=op.device) if split else out
    u = torch.empty_like(o) if split else o
    fp_merge_kernel[(B, Hq)](op, lse, q, k_fp, v_fp, fp_len, o, u, S, sm_scale * LOG2E, q.stride(0), q.stride(1),
                             *k_fp.stride()[:3], *v_fp.stride()[:3], o.stride(0), o.stride(1), GROUP=group,
                             SP=triton.next_power_of_2(S), D=D, BW=64, ROT=-1 if split else fused,
                             RC=norm_constant(D) if fused else 1.0, num_warps=4 if D >= 256 else 2)
    if split:
        res = torch.addmm(u.view(B * Hq, D), o.view(B * Hq, D), v_rot.T)
        out.copy_(res.view(B, Hq, D))


def unsupported(q: torch.Tensor, kv) -> str | None:
    """Why the Triton attention kernels (decode and extend) cannot run q [*, Hq, D] over `kv`, or None."""
    D = q.shape[-1]
    if D not in HEAD_DIMS:
        return f"head_dim {D} is not supported by the Triton kernels (supported: {HEAD_DIMS}); use backend='reference'"
    if kv.k_spec.pre_rope:
        return (f"k_spec {kv.k_spec} stores keys before RoPE; the Triton kernels do not apply RoPE in-kernel yet; "
                "use backend='reference'")
    for name, spec in (("k_spec", kv.k_spec), ("v_spec", kv.v_spec)):
        if spec.twos:
            return (f"{name} {spec} stores two's-complement sub-byte codes (FreeToken); the Triton tiles read offset "
                    "binary; use backend='reference'")
    if not can_launch(q):
        return "the Triton kernels need CUDA tensors, or TRITON_INTERPRET=1 (set before importing triton) on the CPU"
    return None
