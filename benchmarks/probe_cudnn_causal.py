"""Probe (issue 17): can one cuDNN call attend a chunk over its prefix and its own causal part?

    python benchmarks/probe_cudnn_causal.py [--out DIR]

extend's dense path attends the dequantized prefix with one cuDNN call (non-causal), the chunk's causal part with a
second (or flash varlen), and merges the two by log-sum-exp in a third launch. If torch's cuDNN attention op aligns a
causal mask bottom-right when there are more keys than queries (query i of a C-token chunk sees every prefix key and
chunk keys up to i), the chunk's K / V can be written after the prefix in the workspace and the three launches become
one. torch documents a top-left alignment for `is_causal` with L != S; what its cuDNN op does is what this measures.

For each shape (batch 1; the 8K shapes of the extend table: Hq 32 / Hk 8 / D 128, SmolLM2's Hq 9 / Hk 3 / D 64,
Hq 8 / Hk 4 / D 256; 1,024-token chunk over an 8K prefix):
1. `aten._scaled_dot_product_cudnn_attention` with is_causal=True over L + C keys: its error against a float32
   reference with the bottom-right mask and with the top-left one (or the error it raises);
2. the same through `F.scaled_dot_product_attention` under the cuDNN backend with `attn_mask=causal_lower_right`;
3. times (CUDA-graph replay, median ms): cuDNN non-causal over L + C keys (the extend table's peer), the causal
   call of 1 where it is right, and today's two calls (prefix non-causal + chunk causal square) without the merge.
Prints one line per check; writes probe_cudnn_causal.txt under --out.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

LINES: list[str] = []
CHUNK = 1024
SHAPES = {"b1_8k_d128": (32, 8, 128), "smollm2_8k": (9, 3, 64), "d256_8k": (8, 4, 256)}


def say(*a) -> None:
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    LINES.append(s)


def reference(q, pos, k, v, scale, align):
    """Queries q [1, Hq, M, D] at chunk positions pos [M] over keys k / v [1, Hk, N, D] -> float32 [1, Hq, M, D];
    align "br" / "tl": the causal diagonal bottom-right (position i sees keys j <= N - C + i, C the chunk length) or
    top-left (j <= i)."""
    Hq, Hk = q.shape[1], k.shape[1]
    kk = k.float().repeat_interleave(Hq // Hk, 1)
    vv = v.float().repeat_interleave(Hq // Hk, 1)
    s = torch.einsum("bhcd,bhnd->bhcn", q.float(), kk) * scale
    j = torch.arange(k.shape[2], device=q.device)[None, :]
    lim = pos[:, None] + (k.shape[2] - CHUNK if align == "br" else 0)
    s = s.masked_fill(j > lim, float("-inf"))
    return torch.einsum("bhcn,bhnd->bhcd", torch.softmax(s, -1), vv)


def rel(a, b) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def cudnn(q, k, v, scale, causal):
    """torch's cuDNN attention op on [B, H, S, D] bf16 (GQA by repeating K / V heads when Hq != Hk)."""
    if q.shape[1] != k.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    return torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False, scale=scale)[0]


def graph_ms(fn) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--prefix", type=int, default=8192)
    ap.add_argument("--chunk", type=int, default=1024)
    a = ap.parse_args()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right
    dev, bf = "cuda", torch.bfloat16
    say("torch", torch.__version__, "cudnn", torch.backends.cudnn.version(), torch.cuda.get_device_name())
    global CHUNK
    L, C = a.prefix, a.chunk
    CHUNK = C
    g = torch.Generator(device=dev).manual_seed(0)
    for name, (Hq, Hk, D) in SHAPES.items():
        sc = D ** -0.5
        q = torch.randn(1, Hq, C, D, device=dev, dtype=bf, generator=g)
        k = torch.randn(1, Hk, L + C, D, device=dev, dtype=bf, generator=g)
        v = torch.randn(1, Hk, L + C, D, device=dev, dtype=bf, generator=g)
        pos = torch.cat([torch.arange(64), torch.arange(C - 64, C)]).to(dev)  # first and last 64 queries
        want = {al: reference(q[:, :, pos], pos, k, v, sc, al) for al in ("br", "tl")}

        def pick(o):
            return o[:, :, pos]
        ok_one = False
        try:
            o = cudnn(q, k, v, sc, True)
            e_br, e_tl = rel(pick(o), want["br"]), rel(pick(o), want["tl"])
            ok_one = e_br < 2e-2
            say(f"{name} aten cudnn is_causal L+C keys: err bottom-right {e_br:.4f} top-left {e_tl:.4f}")
        except Exception as e:  # noqa: BLE001 - the answer may be that it refuses
            say(f"{name} aten cudnn is_causal L+C keys: raises {type(e).__name__}: {str(e)[:160]}")
        ok_bias = False
        try:
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                o2 = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(C, L + C), scale=sc,
                                                    enable_gqa=Hq != Hk)
            e2 = rel(pick(o2), want["br"])
            ok_bias = e2 < 2e-2
            say(f"{name} sdpa cudnn causal_lower_right: err bottom-right {e2:.4f}")
        except Exception as e:  # noqa: BLE001
            say(f"{name} sdpa cudnn causal_lower_right: raises {type(e).__name__}: {str(e)[:160]}")
        kp, vp, kc, vc = k[:, :, :L], v[:, :, :L], k[:, :, L:], v[:, :, L:]
        t_peer = graph_ms(lambda: cudnn(q, k, v, sc, False))
        t_two = graph_ms(lambda: (cudnn(q, kp, vp, sc, False), cudnn(q, kc, vc, sc, True)))
        line = f"{name} graph ms: peer (non-causal, L + C keys) {t_peer:.4f}  prefix + chunk (two calls) {t_two:.4f}"
        if ok_one:
            line += f"  one causal call {graph_ms(lambda: cudnn(q, k, v, sc, True)):.4f}"
        if ok_bias:
            def biased():
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(C, L + C), scale=sc,
                                                          enable_gqa=Hq != Hk)
            line += f"  sdpa lower-right {graph_ms(biased):.4f}"
        say(line)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "probe_cudnn_causal.txt").write_text("\n".join(LINES) + "\n")


if __name__ == "__main__":
    main()
