"""Where the fixed cost of a short-context decode step goes (issue 16; Gemma 3's sliding layers hold 512 tokens at
head_dim 256, where a quantized step costs 4-5x bf16's 0.011 ms: benchmarks/NOTES_decode.md).

    python benchmarks/fixed_cost_probe.py --out DIR [--contexts 512,8192]

Three parts, each graph-replayed (triton.testing.do_bench_cudagraph, median), on the GPU:
  1. the Gluon paged kernel alone (no full-precision tokens) at fixed configs, Gemma's shape (B 32, Hq 4, Hk 1,
     D 256) and SmolLM2's (B 32, Hq 9, Hk 3, D 64): tokens per warp x warps x splits, with the registers and spills
     of each compiled kernel; beside the Triton kernel's bf16 step at the same shape;
  2. the Hadamard rotation of q / of the output ([B * Hq, D] @ [D, D]): fp32 (today), TF32, bf16 and fp16 matmuls;
  3. `fp_merge_kernel` (the 36 full-precision tokens beside the split merge) at its block of tokens and warps.
Writes DIR/probe.csv (part, shape, scheme, context, variant, ms, regs, spills) and prints it.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

SHAPES = {"gemma3": dict(B=32, Hq=4, Hk=1, D=256), "smollm2": dict(B=32, Hq=9, Hk=3, D=64),
          "b1": dict(B=1, Hq=32, Hk=8, D=128), "d256": dict(B=32, Hq=8, Hk=4, D=256),
          "b8": dict(B=8, Hq=32, Hk=8, D=128)}
SCHEMES = ["q4_0", "lm2:s=e4m3:rot=had"]
CONFIGS = ["tw32:s9", "tw16:s9", "tw32:s4", "tw16:s16", "tw16:s32", "tw16:s16:w2", "tw16:s4:w8", "tw16:s1",
           "tw16:s9:f", "tw16:s16:f"]


class Recorder:
    """Stands in for a JIT kernel: launches it and keeps the compiled kernel of the last launch."""

    def __init__(self, fn):
        self.fn, self.last = fn, None

    def __getitem__(self, grid):
        def launch(*a, **kw):
            self.last = self.fn[grid](*a, **kw)
            return self.last
        return launch


def _bench(fn) -> float:
    import triton.testing
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median")


def kernels(rows, contexts, shapes=("gemma3", "smollm2"), schemes=SCHEMES, configs=CONFIGS, bf16=True):
    import kvlab
    from decode_configs import parse_config
    from kvlab.kernels.autotune import synthetic_cache
    from kvlab.kernels.checks import check_prefix
    from kvlab.kernels.decode import gluon
    from kvlab.kernels.decode import triton as tdec
    from kvlab.kernels.configs import TritonDecodeConfig
    rec = Recorder(gluon._decode_mma_kernel)
    gluon._decode_mma_kernel = rec
    for sname in shapes:
        s = SHAPES[sname]
        B, Hq, Hk, D = s["B"], s["Hq"], s["Hk"], s["D"]
        for L in contexts:
            for name in (["bf16"] if bf16 else []) + list(schemes):
                try:  # a scheme preset (kivi4) or a spec used for K and V
                    sch = kvlab.scheme(name)
                except ValueError:
                    sch = kvlab.scheme(f"k={name},v={name}")
                P = 32 if sch.k.axis == "chan" else 16
                c = synthetic_cache(sch.k, sch.v, B, Hk, D, P, L, "cuda")
                q = torch.randn(B, Hq, D, device="cuda", dtype=torch.bfloat16)
                kv = check_prefix(q, c["k_pages"], c["v_pages"], c["kv_indptr"], c["kv_indices"],
                                  c["kv_last_page_len"], sch.k, sch.v, P, None, None, None, c["k_ts"], c["v_ts"], B)
                if name == "bf16":
                    for S in (4, 9, 16):
                        fn = tdec.run(q, kv, D ** -0.5, TritonDecodeConfig(num_splits=S), plan=True)
                        rows.append(dict(part="kernel", shape=sname, scheme=name, context=L,
                                         variant=f"triton:s{S}", ms=_bench(fn), regs="", spills=""))
                        print(rows[-1], flush=True)
                    continue
                for text in configs:
                    cfg = parse_config(text)
                    why = gluon.why_not(q, kv, cfg)
                    if why:
                        print("skip", sname, name, text, why, flush=True)
                        continue
                    try:
                        fn = gluon.run(q, kv, D ** -0.5, cfg, plan=True)
                        ms = _bench(fn)
                    except Exception as e:  # noqa: BLE001 - a config that does not compile is a row, not a stop
                        print("fail", sname, name, text, type(e).__name__, str(e)[:200], flush=True)
                        continue
                    k = rec.last
                    rows.append(dict(part="kernel", shape=sname, scheme=name, context=L, variant=text, ms=ms,
                                     regs=getattr(k, "n_regs", ""), spills=getattr(k, "n_spills", "")))
                    print(rows[-1], flush=True)
                del c, kv
                torch.cuda.empty_cache()


def rotations(rows):
    from kvlab.quant.rotation import hadamard
    for sname in ("gemma3", "smollm2"):
        s = SHAPES[sname]
        M, D = s["B"] * s["Hq"], s["D"]
        H = hadamard(D, "cuda")
        x32 = torch.randn(M, D, device="cuda")
        xb = x32.bfloat16()
        out = torch.empty(M, D, device="cuda")
        variants = {
            "fp32": lambda: torch.mm(xb.float(), H),
            "fp32 mm only": lambda: torch.mm(x32, H, out=out),
            "bf16": lambda: torch.mm(xb, H.bfloat16()),
            "fp16": lambda: torch.mm(xb.half(), H.half()),
        }
        for v, fn in variants.items():
            rows.append(dict(part="rotation", shape=sname, scheme="", context="", variant=v, ms=_bench(fn), regs="",
                             spills=""))
            print(rows[-1], flush=True)
        torch.backends.cuda.matmul.allow_tf32 = True
        rows.append(dict(part="rotation", shape=sname, scheme="", context="", variant="tf32",
                         ms=_bench(lambda: torch.mm(x32, H, out=out)), regs="", spills=""))
        torch.backends.cuda.matmul.allow_tf32 = False
        print(rows[-1], flush=True)


def merges(rows):
    import triton

    from kvlab.kernels.tiles.attention import fp_merge_kernel
    from kvlab.kernels.tiles.operands import LOG2E
    for sname in ("gemma3", "smollm2"):
        s = SHAPES[sname]
        B, Hq, Hk, D = s["B"], s["Hq"], s["Hk"], s["D"]
        S, W = 9, 36
        op = torch.randn(B, Hq, S, D, device="cuda")
        lse = torch.randn(B, Hq, S, device="cuda")
        q = torch.randn(B, Hq, D, device="cuda", dtype=torch.bfloat16)
        kf = torch.randn(B, Hk, 48, D, device="cuda", dtype=torch.bfloat16)
        vf = torch.randn_like(kf)
        fl = torch.full((B,), W, dtype=torch.int32, device="cuda")
        o = torch.empty(B, Hq, D, device="cuda", dtype=torch.bfloat16)
        for BW in (16, 32, 64):
            for nw in (2, 4, 8):
                def fn():
                    fp_merge_kernel[(B, Hq)](op, lse, q, kf, vf, fl, o, o, S, D ** -0.5 * LOG2E, q.stride(0),
                                             q.stride(1), *kf.stride()[:3], *vf.stride()[:3], o.stride(0),
                                             o.stride(1), GROUP=Hq // Hk, SP=triton.next_power_of_2(S), D=D, BW=BW,
                                             ROT=False, num_warps=nw)
                try:
                    ms = _bench(fn)
                except Exception as e:  # noqa: BLE001
                    print("fail merge", sname, BW, nw, type(e).__name__, str(e)[:200], flush=True)
                    continue
                rows.append(dict(part="fp_merge", shape=sname, scheme="", context=W, variant=f"bw{BW}:w{nw}", ms=ms,
                                 regs="", spills=""))
                print(rows[-1], flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--contexts", default="512,8192")
    ap.add_argument("--parts", default="rotations,merges,kernels")
    ap.add_argument("--shapes", default="gemma3,smollm2", help=f"of {','.join(SHAPES)}")
    ap.add_argument("--schemes", default=",".join(SCHEMES), help="K (= V) spec texts or scheme texts, ','-separated "
                    "(';'-separated when any holds a ',': k=...,v=...)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="decode_configs.py config texts")
    ap.add_argument("--no-bf16", action="store_true", help="leave out the Triton bf16 rows")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    try:
        parts = a.parts.split(",")
        if "rotations" in parts:
            rotations(rows)
        if "merges" in parts:
            merges(rows)
        if "kernels" in parts:
            kernels(rows, [int(x) for x in a.contexts.split(",")], a.shapes.split(","),
                    a.schemes.split(";" if ";" in a.schemes else ","),
                    a.configs.split(","), not a.no_bf16)
    finally:  # what was measured is kept even if a later part fails
        with open(out / "probe.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["part", "shape", "scheme", "context", "variant", "ms", "regs", "spills"])
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
