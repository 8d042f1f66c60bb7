"""Offline sm_90 compile of the decode kernels on a machine without a GPU (developer tool).

    python -m devtools.sm90_offline q4_0 q8_0 ... [--asm] [--bn 128] [--warps 4] [--sass DIR]
    python -m devtools.sm90_offline gluon:q4_0 gluon:q8_0 [--warps 4] [--tw 16]   # Gluon MMA kernel

Swaps Triton's active driver for a stub that reports an sm_90 target, runs `decode` on small
CPU tensors with launches turned into compiles (warmup), and prints registers, spills, shared
memory and the SASS instruction mix of the main loop of every compiled decode kernel.
Needs the ptxas / cuobjdump that ship with Triton; run it without TRITON_INTERPRET. The counts follow the Triton
that compiles: for the H200's own (3.6.0), `eval "$(bash devtools/device_triton.sh)"` first.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import subprocess
import tempfile

import torch


class _StubDriver:
    def __init__(self):
        from triton.backends.compiler import GPUTarget
        self.target = GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target

    def get_device_interface(self):
        return torch.cuda

    def get_active_torch_device(self):
        return torch.device("cpu")

    def get_benchmarker(self):
        raise RuntimeError("no GPU")


@contextlib.contextmanager
def offline_compiles():
    """Within: the active Triton driver is an sm_90 stub and every JIT launch compiles without running;
    yields the list that collects (kernel name, CompiledKernel). The previous driver comes back after."""
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction
    kernels = []
    orig = JITFunction.run

    def run(self, *args, grid, warmup, **kw):
        k = orig(self, *args, grid=grid, warmup=True, **kw)
        kernels.append((self.fn.__name__, k))
        return k
    prev = driver._active  # restored afterwards: a test session goes on launching under the interpreter
    driver.set_active(_StubDriver())
    JITFunction.run = run
    try:
        yield kernels
    finally:
        JITFunction.run = orig
        driver._active = prev


def _call(scheme: str, B: int, Hq: int, Hk: int, D: int, P: int, L: int, fp: bool = True):
    """(q, PagedKV) of a small synthetic CPU cache for one scheme (fp: with the full-precision buffers a
    scheme with a window, sinks or channel-axis keys has)."""
    import kvlab
    from kvlab.kernels.autotune import synthetic_cache
    from kvlab.kernels.paged import PagedKV
    sch = kvlab.scheme(scheme)
    c = synthetic_cache(sch.k, sch.v, B, Hk, D, P, L, "cpu")
    fp = _fp_args(sch, B, Hk, D) if fp else dict(k_fp=None, v_fp=None, fp_len=None)
    kv = PagedKV(c["k_pages"], c["v_pages"], c["kv_indptr"], c["kv_indices"], c["kv_last_page_len"], sch.k, sch.v, P,
                 fp["k_fp"], fp["v_fp"], fp["fp_len"], c["k_ts"], c["v_ts"])
    return torch.randn(B, Hq, D, dtype=torch.bfloat16), kv


def compile_decode(scheme: str, config, B=2, Hq=32, Hk=8, D=128, P=16, L=64):
    """-> list of (name, CompiledKernel) for one Triton decode call (decode kernel [+ merge]);
    config: a TritonDecodeConfig or its dict (num_splits defaults to 2)."""
    from kvlab.kernels.configs import config_from_dict
    from kvlab.kernels.decode import triton as backend
    from kvlab.kernels.env import offline_codegen
    cfg = config_from_dict("decode", config)
    cfg = cfg.replace(num_splits=cfg.num_splits or 2)
    with offline_compiles() as kernels, offline_codegen():
        q, kv = _call(scheme, B, Hq, Hk, D, P, L)
        backend.run(q, kv, D ** -0.5, cfg)
    return kernels


def compile_gluon(scheme="q4_0", num_warps=4, tokens_per_warp=16, B=2, Hq=32, Hk=8, D=128, P=16, L=200,
                  num_splits=2, maxnreg=None, fp=True, prefetch=None, unroll=False, l2=0, st=False):
    """-> list of (name, CompiledKernel) for one Gluon MMA decode call (prefetch: the config's; None its default)."""
    from kvlab.kernels.configs import GluonDecodeConfig
    from kvlab.kernels.decode import gluon
    cfg = GluonDecodeConfig(num_warps=num_warps, tokens_per_warp=tokens_per_warp, num_splits=num_splits,
                            maxnreg=maxnreg, prefetch=prefetch, unroll=unroll, l2_prefetch=l2,
                            scores_t=st)
    with offline_compiles() as kernels:
        q, kv = _call(scheme, B, Hq, Hk, D, P, L, fp)
        gluon.run(q, kv, D ** -0.5, cfg)
    return kernels


def _fp_args(sch, B, Hk, D) -> dict:
    """Full-precision window / sink buffers for a scheme that has them (else Nones)."""
    W = max(sch.window + sch.sink, 1) if (sch.window or sch.sink or sch.k.axis == "chan") else 0
    if not W:
        return dict(k_fp=None, v_fp=None, fp_len=None)
    return dict(k_fp=torch.randn(B, Hk, W, D, dtype=torch.bfloat16), v_fp=torch.randn(B, Hk, W, D, dtype=torch.bfloat16),
                fp_len=torch.full((B,), W, dtype=torch.int32))


def sass(kernel, what="-sass") -> str:
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "k.cubin")
        with open(p, "wb") as f:
            f.write(kernel.asm["cubin"])
        import triton
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        return subprocess.check_output([tool, what, p], text=True)


def resources(kernel) -> str:
    """'REG:n STACK:n SHARED:n LOCAL:n ...' of the cubin (spills show as LOCAL / STACK)."""
    m = re.search(r"(REG:\d+.*)", sass(kernel, "-res-usage"))
    return m.group(1).strip() if m else "?"


def _loop_body(text: str) -> tuple[list[str], list[int]]:
    """(SASS lines, their addresses) of the largest backward-branch loop body: `loop_mix`'s and `skip_path`'s loop."""
    lines = [ln for ln in text.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", ln)]
    addr = [int(re.match(r"\s+/\*([0-9a-f]+)\*/", ln).group(1), 16) for ln in lines]
    best = (0, 0)
    for i, ln in enumerate(lines):
        m = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", ln)
        if m and m.group(1):
            tgt = int(m.group(1), 16)
            if tgt < addr[i] and addr[i] - tgt > best[1] - best[0]:
                best = (tgt, addr[i])
    body = [(ln, a) for ln, a in zip(lines, addr) if best[0] <= a <= best[1]]
    return [ln for ln, _ in body], [a for _, a in body]


def loop_mix(text: str) -> tuple[int, collections.Counter]:
    """Instruction mix of the largest backward-branch loop body in the SASS."""
    body, _ = _loop_body(text)
    ops = collections.Counter()
    for ln in body:
        m = re.search(r"\*/\s+(?:@!?U?P\w+\s+)?((?:LDS|STS|LDSM)(?:\.[A-Z0-9_.]+)?)\s", ln)
        if m:  # shared-memory traffic with its width (LDS.U8 = byte gathers, LDSM = ldmatrix)
            ops["  " + m.group(1)] += 1
        m = re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.[A-Z0-9_.]+)?", ln)
        if m:
            ops[m.group(1)] += 1
    return len(body), ops


def skip_path(text: str) -> int:
    """Instructions of `loop_mix`'s loop body on its shortest path: less those that forward branches inside the body
    jump over (a block the warp skips when no head's max moved, `gluon._rescale`); the body's count where it has
    none."""
    body, addr = _loop_body(text)
    skipped, end = 0, -1
    for ln, a in zip(body, addr):
        m = re.search(r"@!?P\d\s+BRA\s+0x([0-9a-f]+)", ln)
        if m and a > end and a < int(m.group(1), 16) <= addr[-1]:
            end = int(m.group(1), 16)
            skipped += sum(1 for b in addr if a < b < end)
    return len(body) - skipped


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("schemes", nargs="+")
    ap.add_argument("--bn", type=int, default=128)
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--asm", action="store_true")
    ap.add_argument("--layout", default=None, choices=["operand", "rowfirst"],
                    help="tile layout (config 'layout'): rowfirst dequantizes in the load's row layout")
    ap.add_argument("--maxnreg", type=int, default=None, help="register cap per thread (ptx .maxnreg)")
    ap.add_argument("--orient", default=None, choices=["q", "kv"], help="config 'orient' (kv: scores^T = K q^T)")
    ap.add_argument("--dot", default=None, choices=["fp32", "bf16", "fp16", "fma"], help="config 'dot' (fma: CUDA cores)")
    ap.add_argument("--sass", default=None, help="write full SASS per scheme into this folder")
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--tw", type=int, default=16, choices=[16, 32], help="gluon:SCHEME: tokens per warp per tile")
    ap.add_argument("--head-dim", type=int, default=128, help="head dim D")
    ap.add_argument("--no-fp", action="store_true", help="gluon:SCHEME: no full-precision buffers (no fp loop)")
    ap.add_argument("--page", type=int, default=16, help="page size (channel-axis keys need a multiple of their group)")
    ap.add_argument("--heads", default="32,8", help="query heads, KV heads")
    ap.add_argument("--unroll", action="store_true", help="gluon:SCHEME: the prefetching tile loop unrolled by two "
                    "(config `unroll`)")
    ap.add_argument("--l2", type=int, default=0, help="gluon:SCHEME: L2 prefetch this many tiles ahead (config "
                    "`l2_prefetch`; 0 off)")
    ap.add_argument("--st", action="store_true", help="gluon:SCHEME: the scores transposed, S^T = K Q^T (config "
                    "`scores_t`)")
    ap.add_argument("--prefetch", default=None, choices=["on", "off"], help="gluon:SCHEME: the register prefetch "
                    "(default: the config's default, `gluon.prefetches`)")
    a = ap.parse_args(argv)
    Hq, Hk = (int(x) for x in a.heads.split(","))
    cfg = {"block_n": a.bn, "num_warps": a.warps, "num_stages": a.stages, "asm": a.asm, "maxnreg": a.maxnreg,
           "layout": a.layout or "operand", "dot": a.dot, "orient": a.orient or "q", "version": 1}
    for s in a.schemes:
        gl = s.startswith("gluon:")
        compiled = (compile_gluon(s[len("gluon:"):], a.warps, a.tw, Hq=Hq, Hk=Hk, D=a.head_dim, P=a.page,
                                  maxnreg=a.maxnreg, fp=not a.no_fp,
                                  prefetch=None if a.prefetch is None else a.prefetch == "on", unroll=a.unroll,
                                  l2=a.l2, st=a.st)
                    if gl else compile_decode(s, cfg, Hq=Hq, Hk=Hk, D=a.head_dim))
        for name, k in compiled:
            if name not in ("_decode_kernel", "_decode_mma_kernel"):
                continue
            text = sass(k)
            n, ops = loop_mix(text)
            ns = skip_path(text)
            md = k.metadata
            smem_ops = {o.strip(): c for o, c in ops.items() if o.startswith("  ")}
            ops = collections.Counter({o: c for o, c in ops.items() if not o.startswith("  ")})
            print(f"{s:24s} {resources(k).split(' CONSTANT')[0]} smem={md.shared} loop_instrs={n} "
                  + (f"loop_skip={ns} " if ns != n else "") + " ".join(f"{o}:{c}" for o, c in ops.most_common(a.top)) + "\n    smem ops: "
                  + " ".join(f"{o}:{c}" for o, c in sorted(smem_ops.items())))
            if a.sass:
                os.makedirs(a.sass, exist_ok=True)
                with open(os.path.join(a.sass, re.sub(r"[^A-Za-z0-9_]+", "_", s) + ".sass"), "w") as f:
                    f.write(text)
                with open(os.path.join(a.sass, re.sub(r"[^A-Za-z0-9_]+", "_", s) + ".ttgir"), "w") as f:
                    f.write(k.asm["ttgir"])


if __name__ == "__main__":
    main()
