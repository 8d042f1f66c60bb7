"""Calibrated levels per layer or per (KV head, channel group)? An offline measurement on SmolLM2's keys.

Issue 18 asks for codebooks calibrated per layer "and per channel group for keys". Before building per-group tables
into the pool and the kernels, this script measures what they would buy: for every layer, keys and queries are
captured on the calibration text (license, 1,024 tokens) and on held-out text (pydoc, 2,048 tokens); levels are
fitted on the calibration keys (weighted k-means, each value weighted by its group scale squared times the mean
square of the query channel it meets, an int's end levels kept, as `kvlab.quant.fit_codebook`) at four granularities: one table per layer
(what `cal` is), per KV head, per (KV head, group of 8 or 16 channels) and per (KV head, channel); the held-out keys
are quantized with each and scored by the mean squared error of the attention scores q . k over (query, key) pairs
(every 8th query). Two families:

* Lloyd-Max codebooks (levels in units of the group RMS): `lm4` / `lm3` on channel-axis groups (32 tokens a channel),
  with and without a Hadamard rotation, and on token-axis groups of 64 rotated channels (the searched winners' V);
* calibrated ints (levels in units of the int's min-max step): `int2` / `int3` / `int4` asymmetric on channel-axis
  groups (KIVI keys), against the plain ints.

    python benchmarks/codebook_groups_offline.py --out sweeps/results/quality/cal_ints   (about 8 minutes, 2 cores)

Writes codebook_groups.json (per layer, per spec, per granularity) and codebook_groups.txt (means over layers,
relative to the spec without calibration).
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

from kvlab.eval.faithful import _query_weights
from kvlab.eval.perplexity import bos_prefix, segments, text_tokens
from kvlab.model import load_model
from kvlab.quant import fake_quantize, fit_codebook, rotate
from kvlab.quant.calibrated import lloyd_levels
from kvlab.quant.formats import codebook, scale_value, store_scale, uniform_levels
from kvlab.quant.oracle import _quant_int, _reduce, group
from kvlab.spec import as_spec

GRANULARITIES = {"layer": None, "head": 0, "head x 16 ch": 16, "head x 8 ch": 8, "head x ch": 1}
SPECS = ["lm4:g32:chan", "lm4:g32:chan:rot=had", "lm4:g64:rot=had", "lm3:g32:chan", "lm3:g64:rot=had",
         "int4:g32:chan:asym", "int3:g32:chan:asym", "int2:g32:chan:asym"]


def score_err(k: torch.Tensor, kh: torch.Tensor, q: torch.Tensor) -> float:
    """Mean squared error of q . k over (every 8th query, every key) pairs. k, kh [1, Hk, T, D], q [1, Hq, T, D]."""
    Hq, Hk = q.shape[1], k.shape[1]
    qq = q.float().reshape(1, Hk, Hq // Hk, -1, q.shape[-1])[..., ::8, :]
    return float(torch.einsum("bhrtd,bhsd->bhrts", qq, (k - kh).float()).pow(2).mean())


def units(x: torch.Tensor, spec):
    """(u, r, zero, back): the values in the spec's level units u = (x - zero) / r as [1, Hk, T, D] (the rotated
    domain when it rotates), the per-element scale r and zero, and `back` mapping levels-domain values to keys."""
    xf = rotate(x.float()) if spec.rotation == "had" else x.float()
    B, Hk, T, D = xf.shape
    xg = group(xf, spec)
    if spec.fmt == "int":
        _, s_st, m_st = _quant_int(xg, spec, 1.0)
        r = scale_value(s_st, spec.scale_dtype).expand(xg.shape)
        z = scale_value(m_st, spec.scale_dtype).expand(xg.shape)
    else:
        r = scale_value(store_scale(_reduce(xg, "rms", spec), spec.scale_dtype), spec.scale_dtype).expand(xg.shape)
        z = torch.zeros_like(xg)

    def flat(t):  # grouped [..., A, B, G] -> [1, Hk, T, D]
        if spec.axis == "chan":
            return t.reshape(B, Hk, T // spec.group, D, spec.group).transpose(-1, -2).reshape(B, Hk, T, D)
        return t.reshape(B, Hk, T, D)
    r, z = flat(r.contiguous()), flat(z.contiguous())
    u = (flat(xg) - z) / torch.where(r == 0, torch.ones_like(r), r)

    def back(y):
        return rotate(y) if spec.rotation == "had" else y  # the normalised Sylvester Hadamard is its own inverse
    return u, r, z, back


def fit_tables(u, r, w, spec, cg, iters: int = 40) -> torch.Tensor:
    """Levels [Hk, D // cg, n] fitted per (head, channel group of cg) (cg 0: one per head), weighted by r^2 * w."""
    Hk, D = u.shape[1], u.shape[-1]
    n = 2 ** spec.bits
    start = uniform_levels(spec) if spec.fmt == "int" else codebook(spec.fmt)
    cg = D if cg == 0 else cg
    wt = (r ** 2) * w
    tabs = torch.empty(Hk, D // cg, n)
    for h in range(Hk):
        for j in range(D // cg):
            uu = u[:, h, :, j * cg:(j + 1) * cg].reshape(-1)
            ww = wt[:, h, :, j * cg:(j + 1) * cg].reshape(-1)
            lev = lloyd_levels(uu, ww, start, iters, keep_ends=spec.fmt == "int")  # as fit_codebook fits
            tabs[h, j] = lev
    return tabs


def quantize_tables(x, spec, tabs) -> torch.Tensor:
    """x quantized with each (head, channel group)'s levels: nearest level of the group's scale and zero."""
    u, r, z, back = units(x, spec)
    D = u.shape[-1]
    t = tabs.repeat_interleave(D // tabs.shape[1], dim=1)         # [Hk, D, n]
    vals = r[..., None] * t[None, :, None] + z[..., None]         # [1, Hk, T, D, n]
    xs = u * r + z
    idx = (vals - xs[..., None]).abs().argmin(-1, keepdim=True)
    return back(torch.gather(vals, -1, idx)[..., 0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--calib-tokens", type=int, default=1024)
    ap.add_argument("--eval-tokens", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=0, help="first N layers only (0: all; a quick check)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    model, tok = load_model("smollm2")
    cal = segments(text_tokens(tok, "license"), a.calib_tokens, 1, prefix=bos_prefix(tok))[0]
    ev = segments(text_tokens(tok, "pydoc"), a.eval_tokens, 1, prefix=bos_prefix(tok))[0]
    capc, cape = model.capture(cal.reshape(1, -1)), model.capture(ev.reshape(1, -1))
    rows = []
    n_layers = a.layers or model.config.n_layers
    for layer in range(n_layers):
        kc, qc = capc["k"][layer].float(), capc["q"][layer].float()
        ke, qe = cape["k"][layer].float(), cape["q"][layer].float()
        for text in SPECS:
            spec = as_spec(text)
            row = {"layer": layer, "spec": text, "plain": score_err(ke, fake_quantize(ke, spec), qe)}
            w = _query_weights(qc, kc, spec)                      # [1, Hk, 1, D]
            cspec = as_spec(text + ":cal")
            row["layer_cal"] = score_err(ke, fake_quantize(ke, cspec, codebook=fit_codebook(kc, cspec, w)), qe)
            u, r, _, _ = units(kc, spec)
            for name, cg in GRANULARITIES.items():
                if cg is None:
                    continue
                row[name] = score_err(ke, quantize_tables(ke, spec, fit_tables(u, r, w, spec, cg)), qe)
            rows.append(row)
        print(f"layer {layer} {time.time() - t0:.0f} s", flush=True)
    cols = ["layer_cal", *[g for g, c in GRANULARITIES.items() if c is not None]]
    lines = [f"SmolLM2-135M keys: score MSE of q . k on held-out pydoc ({a.eval_tokens} tokens) with levels fitted on "
             f"license ({a.calib_tokens} tokens); mean over layers, relative to the plain spec "
             f"(fixed levels); {n_layers} layers; {time.time() - t0:.0f} s",
             f"{'spec':24s} {'plain MSE':>10s} " + " ".join(f"{c:>13s}" for c in cols)]
    for text in SPECS:
        rs = [r for r in rows if r["spec"] == text]
        base = sum(r["plain"] for r in rs) / len(rs)
        lines.append(f"{text:24s} {base:10.3f} " + " ".join(f"{sum(r[c] for r in rs) / len(rs) / base:13.3f}"
                                                           for c in cols))
    with open(os.path.join(a.out, "codebook_groups.json"), "w") as f:
        json.dump({"model": "SmolLM2-135M-Instruct", "calib": ["license", a.calib_tokens],
                   "eval": ["pydoc", a.eval_tokens], "metric": "mean squared q.k error, every 8th query",
                   "granularities": cols, "rows": rows}, f, indent=1)
    with open(os.path.join(a.out, "codebook_groups.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
