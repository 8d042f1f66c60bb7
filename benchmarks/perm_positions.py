"""Key channel permutations against position: the score error of per-token-grouped keys with no reorder, channels
sorted by magnitude, the order `fit_permutation` finds on the calibration text at its own positions, and the order
it finds over positions spread across the context (what `kvlab.eval.faithful.calibrate` does), each measured on
held-out text at positions 0.. and at 7,000.. (keys and queries post-RoPE, as the cache stores them).

    python benchmarks/perm_positions.py [--model smollm2] [--specs int4:g32:asym,int3:g32:asym,int2:g32:asym]
                                        [--tokens 1024] [--out sweeps/results/quality/permutations/positions.txt]

Calibration: the license text; evaluation: pydoc (both `kvlab.model.text`). Score error: per layer and KV head,
sum over queries of the centred squared error of q . (k_hat - k) (softmax ignores a shift), over every 4th query
past the sinks, divided by the same sum of the exact centred scores; the mean over layers is printed.
"""
from __future__ import annotations

import argparse
import time

import torch

from kvlab.eval.faithful import PERM_OFFSETS, _spread_capture
from kvlab.model import load_model
from kvlab.model.text import license_text, pydoc_topics_text, tokenize_text
from kvlab.quant.oracle import fake_quantize
from kvlab.quant.permutation import fit_permutation, permute_channels
from kvlab.spec import as_spec

SINK = 4


def score_err(k, q, spec, p=None) -> float:
    """Relative centred score error of quantized keys k [1, Hk, T, D] against queries q [1, Hq, T, D]."""
    B, Hk, T, D = k.shape
    kk = k if p is None else permute_channels(k, p, heads_dim=-3)
    kh = fake_quantize(kk.contiguous(), spec).float()
    if p is not None:
        kh = torch.empty_like(kh).scatter_(-1, p[None, :, None, :].expand(kh.shape), kh)
    qs = q[:, :, SINK::4].reshape(B, Hk, -1, D)
    e, ref = qs @ (kh - k).transpose(-1, -2), qs @ k.transpose(-1, -2)
    e, ref = e - e.mean(-1, keepdim=True), ref - ref.mean(-1, keepdim=True)
    return float(e.pow(2).sum() / ref.pow(2).sum())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--specs", default="int4:g32:asym,int3:g32:asym,int2:g32:asym")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--far", type=int, default=7000, help="start position of the far evaluation")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    t0 = time.time()
    m, tok = load_model(a.model)[:2]
    cal = tokenize_text(tok, license_text(), a.tokens)[None]
    ev = tokenize_text(tok, pydoc_topics_text(), a.tokens)[None]
    cc = m.capture(cal)
    spread = _spread_capture(m, cal)
    near, far = m.capture(ev), m.capture(ev, positions=torch.arange(a.tokens) + a.far)
    lines = [f"model {a.model}; calibration license {a.tokens} tokens (spread: {PERM_OFFSETS} starts over the context), "
             f"evaluation pydoc {a.tokens} tokens at positions 0 and {a.far}; relative centred score error, mean over "
             "layers",
             f"{'spec':<16} {'where':>6} {'none':>9} {'sorted':>9} {'fit@own':>9} {'fit@spread':>11}"]
    for text in a.specs.split(","):
        spec = as_spec(text)
        ps = as_spec(text + ":perm")
        acc = {w: [0.0, 0.0, 0.0, 0.0] for w in ("0", "far")}
        L = len(cc["k"])
        for i in range(L):
            rms = cc["k"][i][0, :, SINK:].pow(2).mean(1)                               # [Hk, D]
            orders = [None, rms.argsort(-1), fit_permutation(cc["k"][i], cc["q"][i], ps, sink=SINK),
                      fit_permutation(spread["k"][i], spread["q"][i], ps, sink=SINK)]
            for w, cap in (("0", near), ("far", far)):
                for j, p in enumerate(orders):
                    acc[w][j] += score_err(cap["k"][i], cap["q"][i], spec, p) / L
        for w in ("0", "far"):
            lines.append(f"{text:<16} {w if w == '0' else a.far:>6} " + " ".join(f"{v:9.5f}" for v in acc[w][:3])
                         + f" {acc[w][3]:11.5f}")
    lines.append(f"({time.time() - t0:.0f} s)")
    print("\n".join(lines))
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
