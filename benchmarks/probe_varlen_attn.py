"""Probe (issue 17): what torch's private varlen attention ops do on this GPU, for the extend path's design.

    python benchmarks/probe_varlen_attn.py [--out DIR]

1. cuDNN ragged (`aten._cudnn_attention_forward` with cum_seq_q / cum_seq_k): right against a per-sequence reference,
   with max_k passed larger than the longest sequence (a bucketed plan), its log-sum-exp layout, and the wall time of
   the first call on new key lengths with max_k fixed (does cuDNN build a plan per length?) against varying max_k.
2. flash varlen (`aten._flash_attention_forward`) with is_causal and more keys than queries: is the mask aligned
   bottom-right (query i of a chunk sees all earlier keys and chunk keys up to i)?
3. Timing: one sequence, 4,096 stacked rows (Hk 8, D 128) over 32K keys, ragged cuDNN against the dense cuDNN op.
Prints one line per check; writes probe_varlen.txt under --out.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import triton

LINES: list[str] = []


def say(*a) -> None:
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    LINES.append(s)


def ref_attn(q, k, v, scale, causal_br=False):
    """q [M, H, D], k / v [N, H, D] -> (out [M, H, D] fp32, lse [H, M] natural log); causal bottom-right optional."""
    s = torch.einsum("mhd,nhd->hmn", q.float(), k.float()) * scale
    if causal_br:
        M, N = q.shape[0], k.shape[0]
        i = torch.arange(M, device=q.device)[:, None]
        j = torch.arange(N, device=q.device)[None, :]
        s = s.masked_fill(j > i + (N - M), float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.einsum("hmn,nhd->mhd", torch.softmax(s, -1), v.float()), lse


def rel(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def cudnn_ragged(q, k, v, cq, ck, max_q, max_k, scale):
    return torch.ops.aten._cudnn_attention_forward(q, k, v, None, cq, ck, max_q, max_k, True, 0.0, False, False,
                                                   scale=scale)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    dev, bf = "cuda", torch.bfloat16
    say("torch", torch.__version__, "cudnn", torch.backends.cudnn.version(), torch.cuda.get_device_name())
    H, D, sc = 8, 128, 128 ** -0.5
    g = torch.Generator(device=dev).manual_seed(0)
    # 1. cuDNN ragged: 3 sequences, rows 256 / 512 / 256, keys 3000 / 77 / 4100
    rows, keys = [256, 512, 256], [3000, 77, 4100]
    q = torch.randn(sum(rows), H, D, device=dev, dtype=bf, generator=g)
    k = torch.randn(sum(keys), H, D, device=dev, dtype=bf, generator=g)
    v = torch.randn_like(k)
    cq = torch.tensor([0] + torch.tensor(rows).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    ck = torch.tensor([0] + torch.tensor(keys).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    for max_k in (max(keys), 8192):
        try:
            res = cudnn_ragged(q, k, v, cq, ck, max(rows), max_k, sc)
            out, lse = res[0], res[1]
            errs, lerrs = [], []
            for b in range(3):
                qa, qe, ka, ke = cq[b].item(), cq[b + 1].item(), ck[b].item(), ck[b + 1].item()
                ro, rl = ref_attn(q[qa:qe], k[ka:ke], v[ka:ke], sc)
                errs.append(rel(out[qa:qe], ro))
                if lse.dim() == 2 and lse.shape[-1] == sum(rows):
                    lerrs.append((lse[:, qa:qe].float() - rl).abs().max().item())
                elif lse.dim() >= 2 and lse.shape[0] == sum(rows):
                    lerrs.append((lse.reshape(sum(rows), H)[qa:qe].T.float() - rl).abs().max().item())
            say(f"cudnn ragged max_k={max_k}: out {tuple(out.shape)} strides {out.stride()} lse {tuple(lse.shape)} "
                f"strides {lse.stride()}; rel err per seq {['%.3g' % e for e in errs]}; lse abs err {lerrs}")
        except Exception as e:  # noqa: BLE001
            say(f"cudnn ragged max_k={max_k}: {type(e).__name__}: {str(e)[:300]}")
    # first-call times on new key lengths: max_k fixed (bucket) vs max_k = the length
    rows1 = 4096
    qb = torch.randn(rows1, H, D, device=dev, dtype=bf, generator=g)
    kb = torch.randn(33000, H, D, device=dev, dtype=bf, generator=g)
    vb = torch.randn_like(kb)
    cq1 = torch.tensor([0, rows1], dtype=torch.int32, device=dev)
    for mode in ("bucket", "exact"):
        ts = []
        for i, L in enumerate((30001, 30517, 31033, 31549)):
            ck1 = torch.tensor([0, L], dtype=torch.int32, device=dev)
            mk = 32768 if mode == "bucket" else L
            torch.cuda.synchronize()
            t = time.perf_counter()
            try:
                cudnn_ragged(qb, kb, vb, cq1, ck1, rows1, mk, sc)
                torch.cuda.synchronize()
                ts.append(round((time.perf_counter() - t) * 1e3, 2))
            except Exception as e:  # noqa: BLE001
                ts.append(f"{type(e).__name__}: {str(e)[:120]}")
        say(f"cudnn ragged first calls on new lengths, max_k {mode}: ms {ts}")
    # 2. flash varlen causal with more keys than queries
    qf = torch.randn(300, 32, D, device=dev, dtype=bf, generator=g)
    kf = torch.randn(1000, 8, D, device=dev, dtype=bf, generator=g)
    vf = torch.randn_like(kf)
    cqf = torch.tensor([0, 100, 300], dtype=torch.int32, device=dev)
    ckf = torch.tensor([0, 400, 1000], dtype=torch.int32, device=dev)
    try:
        o, l = torch.ops.aten._flash_attention_forward(qf, kf, vf, cqf, ckf, 200, 600, 0.0, True, False, scale=sc)[:2]
        e = []
        for b in range(2):
            qa, qe, ka, ke = cqf[b].item(), cqf[b + 1].item(), ckf[b].item(), ckf[b + 1].item()
            kk, vv = (t[ka:ke].repeat_interleave(4, dim=1) for t in (kf, vf))
            ro, rl = ref_attn(qf[qa:qe], kk, vv, sc, causal_br=True)
            rt, _ = ref_attn(qf[qa:qe], kk, vv, sc, causal_br=False)
            e.append((rel(o[qa:qe], ro), rel(o[qa:qe], rt)))
        say(f"flash varlen causal Lk > Lq: lse {tuple(l.shape)}; rel err (bottom-right, unmasked) per seq {e}")
    except Exception as ex:  # noqa: BLE001
        say(f"flash varlen causal: {type(ex).__name__}: {str(ex)[:300]}")
    # 3. timing: one sequence, 4096 stacked rows over 32K keys
    L = 32768
    qs = qb[None].transpose(1, 2)  # [1, H, M, D]
    ks, vs = kb[:L][None].transpose(1, 2), vb[:L][None].transpose(1, 2)
    ck1 = torch.tensor([0, L], dtype=torch.int32, device=dev)
    dense = triton.testing.do_bench(lambda: torch.ops.aten._scaled_dot_product_cudnn_attention(
        qs, ks, vs, None, True, 0.0, False, False, scale=sc), warmup=5, rep=100, return_mode="median")
    try:
        ragged = triton.testing.do_bench(lambda: cudnn_ragged(qb, kb, vb, cq1, ck1, rows1, L, sc), warmup=5, rep=100,
                                         return_mode="median")
        ragged_b = triton.testing.do_bench(lambda: cudnn_ragged(qb, kb, vb, cq1, ck1, rows1, 34816, sc), warmup=5,
                                           rep=100, return_mode="median")
    except Exception as e:  # noqa: BLE001
        ragged = ragged_b = f"{type(e).__name__}: {str(e)[:120]}"
    fl = triton.testing.do_bench(lambda: torch.ops.aten._flash_attention_forward(
        qb, kb[:L], vb[:L], cq1, ck1, rows1, L, 0.0, False, False, scale=sc), warmup=5, rep=100, return_mode="median")
    say(f"4096 rows x 32K keys, Hk 8, D 128: cudnn dense {dense:.4f} ms, cudnn ragged {ragged} ms "
        f"(max_k 34816: {ragged_b}), flash varlen {fl:.4f} ms")
    # 4. the fused kernel's merge-only work (32K prefix: the dense part covers it all): whole-call medians per config
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import kvlab
    from run import EXTEND_SHAPES, SCHEMES, extend_cell
    for name in ("bf16", "q4_0"):
        sch = kvlab.scheme(SCHEMES[name])
        for cfg in (None, dict(block_m=128, block_n=128, num_warps=8, num_stages=2),
                    dict(block_m=64, block_n=64, num_warps=4, num_stages=2),
                    dict(block_m=32, block_n=64, num_warps=4, num_stages=1),
                    dict(block_m=16, block_n=32, num_warps=2, num_stages=1)):
            ms = extend_cell(sch, EXTEND_SHAPES["p32k_b1"], "auto", cfg, host=True)
            say(f"p32k_b1 {name} auto_host config {cfg}: {ms:.4f} ms")
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "probe_varlen.txt").write_text("\n".join(LINES) + "\n")


if __name__ == "__main__":
    main()
