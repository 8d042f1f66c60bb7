"""kvlab's fp8 decode against FlashInfer's on the same fp8 bytes and scales (issue 14: the kernels vLLM and
SGLang run fp8 KV caches with on Hopper are FlashAttention-3 and FlashInfer; FlashInfer's XQA decode is the
one measured here, as a peer in the same process, never a kvlab dependency).

    python benchmarks/flashinfer_fp8.py --out sweeps/results/h200/flashinfer_fp8   (on the GPU machine, with the
    bundle of ../shared/peers/flashinfer_wheel.sh on PYTHONPATH)

Correctness: odd-length sequences (1, 300, 517 tokens, pages in random order, slots past the end NaN-poisoned),
fp8 e4m3 pages written by kvlab's oracle, per-tensor k/v scales 1.0 (vLLM's and SGLang's default without a
checkpoint scale) and a calibrated pair (0.37, 1.9); kvlab's public `decode` (default dispatch, bf16 query),
FlashInfer's `xqa_batch_decode_with_kv_cache` and `BatchDecodeWithPagedKVCacheWrapper` (CUDA cores and tensor
cores) each against the float32 reference; agreement within bf16 rounding means max |error| <= 2^-8 of the
output's max magnitude. Timing (CUDA-graph replay medians): B=32 x 32K and B=1 x 32K, Hq 32, Hk 8, D 128, page
16, beside cuDNN bf16 SDPA on dense K/V. Also records whether this GPU's PyTorch fp8 cast saturates (SGLang's
store casts with it).
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "kernels" / "decode"))
from kvlab.spec import parse_spec  # noqa: E402

SCALES = {"unit": (1.0, 1.0), "calibrated": (0.37, 1.9)}


def block_table(indptr, indices, B):
    n = (indptr[1:] - indptr[:-1]).max().item()
    t = torch.zeros(B, max(n, 1), dtype=torch.int32, device=indices.device)
    for b in range(B):
        ids = indices[indptr[b]:indptr[b + 1]]
        t[b, :ids.numel()] = ids
    return t


def seq_lens(indptr, last, P):
    n = indptr[1:] - indptr[:-1]
    return torch.where(n > 0, (n - 1) * P + last, torch.zeros_like(n))


class Peers:
    """FlashInfer's fp8 decode paths over kvlab's page tensors ([pages, Hk, P, D] fp8 = FlashInfer's HND)."""

    def __init__(self, kc, vc, indptr, indices, last, P, Hq, Hk, D, k_scale, v_scale):
        import flashinfer
        self.fi = flashinfer
        self.kc, self.vc = kc.view(torch.float8_e4m3fn), vc.view(torch.float8_e4m3fn)
        B = indptr.numel() - 1
        self.bt = block_table(indptr, indices, B)
        lens = seq_lens(indptr, last, P)
        self.max_len = int(lens.max().item())
        self.lens = lens.to(torch.uint32)
        self.ks, self.vs, self.sm = k_scale, v_scale, D ** -0.5
        self.ws = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
        self.wrappers = {}
        for tc in (False, True):
            w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"),
                                                              "HND", use_tensor_cores=tc)
            w.plan(indptr, indices, last, Hq, Hk, D, P, q_data_type=torch.bfloat16, kv_data_type=torch.float8_e4m3fn)
            self.wrappers["fi_tensor_cores" if tc else "fi_cuda_cores"] = w

    def xqa(self, q):
        return self.fi.decode.xqa_batch_decode_with_kv_cache(
            q, (self.kc, self.vc), self.ws, self.bt, self.lens, self.max_len, bmm1_scale=self.sm * self.ks,
            bmm2_scale=self.vs, kv_layout="HND")

    def run(self, name, q):
        if name == "xqa":
            return self.xqa(q)
        return self.wrappers[name].run(q, (self.kc, self.vc), k_scale=self.ks, v_scale=self.vs)

    names = ("xqa", "fi_cuda_cores", "fi_tensor_cores")


def correctness(rows, log):
    from kvlab.kernels.decode import decode
    from paged_cases import call_args, make_paged
    P = 16
    for (Hq, Hk, D) in ((32, 8, 128), (9, 3, 64)):
        for sname, (ks, vs) in SCALES.items():
            # axis tensor: no scale (1.0) / a static per-tensor scale; the same e4m3 code pages
            spec = parse_spec("fp8_e4m3" if sname == "unit" else "fp8_e4m3:rule=absmax")
            unit = parse_spec("fp8_e4m3")
            c = make_paged([1, 300, 517], Hk, D, P, unit, unit, device="cuda", seed=3)
            args, kw = call_args(c)
            if sname != "unit":
                kw.update(k_tensor_scale=torch.tensor([ks], device="cuda"), v_tensor_scale=torch.tensor([vs], device="cuda"))
            q = torch.randn(3, Hq, D, device="cuda", dtype=torch.bfloat16)
            ref = decode(q.float(), *args, spec, spec, P, **kw, backend="reference")
            top = ref.abs().max().item()
            outs = {"kvlab": decode(q, *args, spec, spec, P, **kw).float()}
            try:
                peers = Peers(c["k_pages"]["codes"], c["v_pages"]["codes"], c["kv_indptr"], c["kv_indices"],
                              c["kv_last_page_len"], P, Hq, Hk, D, ks, vs)
                for n in peers.names:
                    try:
                        outs[n] = peers.run(n, q).float()
                    except Exception as e:  # noqa: BLE001 - a peer that does not run here is reported
                        log(f"  {n}: {type(e).__name__}: {str(e)[:200]}")
            except Exception as e:  # noqa: BLE001
                log(f"  flashinfer: {type(e).__name__}: {str(e)[:300]}")
            for n, o in outs.items():
                err = (o - ref).abs().max().item() / top
                vs_kv = (o - outs["kvlab"]).abs().max().item() / top
                rows.append(dict(test="correctness", impl=n, heads_q=Hq, heads_kv=Hk, head_dim=D, scales=sname,
                                 max_rel_err_vs_fp32=err, max_rel_diff_vs_kvlab=vs_kv,
                                 within_bf16=err <= 2 ** -8, finite=bool(torch.isfinite(o).all())))
                log(f"  H{Hq}/{Hk} D{D} {sname:10s} {n:16s} err {err:.2e}  vs kvlab {vs_kv:.2e}")


def timing(rows, log):
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kvlab.kernels.autotune import synthetic_cache
    from kvlab.kernels.decode import decode
    P, Hq, Hk, D, L = 16, 32, 8, 128, 32768
    for B in (32, 1):
        fp8 = parse_spec("fp8_e4m3")
        c = synthetic_cache(fp8, fp8, B, Hk, D, P, L, "cuda")
        q = torch.randn(B, Hq, D, device="cuda", dtype=torch.bfloat16)
        args = (q, c["k_pages"], c["v_pages"], c["kv_indptr"], c["kv_indices"], c["kv_last_page_len"], fp8, fp8, P)
        fns = {"kvlab": decode(*args, plan=True)}
        try:
            peers = Peers(c["k_pages"]["codes"], c["v_pages"]["codes"], c["kv_indptr"], c["kv_indices"],
                          c["kv_last_page_len"], P, Hq, Hk, D, 1.0, 1.0)
            for n in peers.names:
                fns[n] = (lambda n=n: peers.run(n, q))
        except Exception as e:  # noqa: BLE001
            log(f"  flashinfer: {type(e).__name__}: {str(e)[:300]}")
        kd = torch.randn(B, Hk, L, D, device="cuda", dtype=torch.bfloat16)
        vd = torch.randn_like(kd)
        q4 = q[:, :, None]

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(q4, kd, vd, enable_gqa=True)
        fns["cudnn_bf16"] = cudnn
        bytes_fp8 = 2 * B * L * Hk * D  # K and V codes read once
        base = {}
        for n, fn in fns.items():
            try:
                fn()
                ms = triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median")
            except Exception as e:  # noqa: BLE001
                log(f"  {n}: {type(e).__name__}: {str(e)[:200]}")
                continue
            base[n] = ms
            row = dict(test="timing", impl=n, batch=B, context=L, heads_q=Hq, heads_kv=Hk, head_dim=D, median_ms=ms,
                       tb_per_s=(bytes_fp8 * (2 if n == "cudnn_bf16" else 1)) / ms / 1e9)
            rows.append(row)
        for row in rows:
            if row.get("test") == "timing" and row["batch"] == B:
                row["ratio_vs_cudnn"] = row["median_ms"] / base["cudnn_bf16"] if "cudnn_bf16" in base else None
                row["ratio_vs_xqa"] = row["median_ms"] / base["xqa"] if "xqa" in base else None
                log(f"  B={B:2d} {row['impl']:16s} {row['median_ms']:.4f} ms  {row['tb_per_s']:.2f} TB/s")


def cast_check(log) -> dict:
    x = torch.tensor([440.0, 470.0, 479.0, 480.0, 500.0, -1000.0], device="cuda")
    y = x.to(torch.float8_e4m3fn).float().tolist()
    log(f"  torch {torch.__version__} cuda fp8 e4m3 cast of {x.tolist()}: {y}")
    return {"inputs": x.tolist(), "cuda": y, "cpu": x.cpu().to(torch.float8_e4m3fn).float().tolist(),
            "torch": torch.__version__}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = []

    def log(m):
        print(m, flush=True)
        lines.append(m)
    rows = []
    import importlib.metadata as md
    try:
        fi_version = md.version("flashinfer-python")
    except md.PackageNotFoundError:
        import flashinfer
        fi_version = getattr(flashinfer, "__version__", "?")
    head = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "flashinfer": fi_version}
    log(json.dumps(head))
    log("correctness:")
    correctness(rows, log)
    log("fp8 cast:")
    head["fp8_cast"] = cast_check(log)
    log("timing:")
    timing(rows, log)
    cols = sorted({k for r in rows for k in r}, key=lambda k: (k not in ("test", "impl"), k))
    with open(out / "flashinfer_fp8.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    (out / "header.json").write_text(json.dumps(head, indent=1))
    (out / "log.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
