"""Where the 2.5-bit loss comes from, and key transforms that do not fix it (issue 18 probes, CPU).

    python benchmarks/key_probes.py --out sweeps/results/quality/key_probes   # about 15 min on 2 cores

SmolLM2-135M, 4 x 2,048 pydoc tokens (the winners' evaluation), calibration on the license text, 4 sinks and a
32-token window in full precision (the sink + window winners' setting). Two parts:

1. **K or V alone**: one side quantized, the other bf16, for the formats the 2.5-bit search chooses between.
2. **Calibrated transforms of the keys** before `lm2:g64:s=e4m3:rot=had`, each exact in attention (scores shift by a
   constant per query, which softmax ignores, or the transform folds into q):
   - `center`: subtract the per-(layer, KV head) channel mean mu of the calibration keys (sinks left out);
   - `smooth`: divide channel c by s_c, s_c^2 = rms(k_c) / rms(q_c) (q over the KV head's query heads), normalised
     to unit mean square, q multiplied by s (SmoothQuant's balance: minimises (sum q_c^2 s_c^2)(sum k_c^2 / s_c^2));
   - `center+smooth`: both;
   - `signs`: a fixed random +-1 per channel before the Hadamard rotation (a randomized Hadamard, as TurboQuant's
     random rotation).
   Each is evaluated as dequantize(quantize(T(k))) mapped back through T^-1, which equals what a cache storing T(k)
   with q transformed would score.

3. `--winners`: instead of 1 and 2, the sink + window winners of the 17-candidate search (`winners.csv`) as
   they are and with `smooth` around every key quantizer (the same stored bits: s is a calibration vector).

4. `--smoothing-variants`: the 2.5-bit winner of the 17-candidate search as it is, with the `smooth` scheme option on
   every K spec (`kvlab.quant.fit_smoothing`: per channel, calibrated past the sinks), and with the two constrained
   variants the option was designed against (probes around the oracle): factors tied within RoPE pairs (c, c + D/2),
   which commute with RoPE and fold into W_q / W_k, and the same rounded to powers of two, which make k / s exact;
   and the option with its strength searched per KV head (`calibrate(smooth_search=True)`).

Writes OUT.txt (one line per case: PPL delta mean, KL mean) and OUT.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

BASE = "window=32,sink=4"
SPLIT = ["k=lm2:g64:s=e4m3:rot=had,v=bf16", "k=bf16,v=lm2:g64:s=e4m3:rot=had", "k=lm3:g64:s=e4m3:rot=had,v=bf16",
         "k=int2:g32:chan:asym,v=bf16", "k=int2:g32:chan:asym:prerope,v=bf16"]
KEY = "k=lm2:g64:s=e4m3:rot=had,v=bf16"
TRANSFORMS = ["center", "smooth", "center+smooth", "signs"]


def key_transforms(cap: dict, n_layers: int, sink: int = 4, seed: int = 1) -> dict:
    """{layer: (mu [1, Hk, 1, D], s [1, Hk, 1, D], signs [D])} from a calibration capture (post-RoPE keys)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i in range(n_layers):
        k = cap["k"][i][:, :, sink:].float()                             # [1, Hk, T, D]
        q = cap["q"][i][:, :, sink:].float()                             # [1, Hq, T, D]
        Hk, D = k.shape[1], k.shape[-1]
        qg = q.reshape(1, Hk, -1, q.shape[2], D)
        mu = k.mean(2, keepdim=True)
        a = k.pow(2).mean(2, keepdim=True).sqrt()
        b = qg.pow(2).mean((2, 3)).sqrt()[:, :, None, :]
        s = (a / b.clamp_min(1e-6)).clamp_min(1e-6).sqrt()
        s = s / s.pow(2).mean(-1, keepdim=True).sqrt()
        signs = (torch.randint(0, 2, (D,), generator=g) * 2 - 1).float()
        out[i] = (mu, s, signs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output path without extension")
    ap.add_argument("--segments", type=int, default=4)
    ap.add_argument("--winners", action="store_true", help="part 3: the 17-candidate sink + window winners, with and "
                    "without key smoothing")
    ap.add_argument("--smoothing-variants", action="store_true", help="part 4: the 2.5-bit winner unsmoothed, with the "
                    "smooth option, and with pair-tied / power-of-two factors")
    a = ap.parse_args()
    import kvlab.eval.faithful as F
    from kvlab.eval.faithful import calibrate
    from kvlab.eval.perplexity import bos_prefix, score_segments, segments, text_tokens
    from kvlab.model import load_model
    from kvlab.spec import as_scheme

    model, tok = load_model("smollm2", dtype=torch.float32)
    prefix = bos_prefix(tok)
    segs = segments(text_tokens(tok, "pydoc"), 2048, a.segments, 0, prefix)
    ct = torch.cat([torch.tensor(prefix, dtype=torch.int64), text_tokens(tok, "license")[:2048 - len(prefix)]])
    n = model.config.n_layers
    cap = model.capture(ct[None])
    tr = key_transforms(cap, n)
    orig = F.fake_quantize
    mode = {"t": None}

    def fq(x, spec, probe=None, **kw):  # the keys' quantizer with the probe's transform around it
        t = mode["t"]
        if probe is None or t is None:
            return orig(x, spec, **kw)
        mu, s, sg = tr[probe]
        if t == "center":
            return orig(x - mu, spec, **kw) + mu
        if t == "smooth":
            return orig(x / s, spec, **kw) * s
        if t == "center+smooth":
            return orig((x - mu) / s, spec, **kw) * s + mu
        if t == "signs":
            return orig(x * sg, spec, **kw) * sg
        if t in ("pair", "pair-pow2"):
            s2 = pair_tied(probe, t == "pair-pow2")
            return orig(x / s2, spec, **kw) * s2
        raise ValueError(t)

    def pair_tied(i, pow2, cache={}):  # noqa: B006 (a per-run memo)
        if (i, pow2) not in cache:
            k, q = cap["k"][i][:, :, 4:].float(), cap["q"][i][:, :, 4:].float()
            B, Hk, T, D = k.shape
            a, b = k.pow(2).mean((0, 2)), q.reshape(B, Hk, -1, T, D).pow(2).mean((0, 2, 3))
            pr = lambda m: (0.5 * (m[:, :D // 2] + m[:, D // 2:])).repeat(1, 2).sqrt()  # noqa: E731
            lg = 0.5 * (pr(a).log2() - pr(b).log2())
            lg = lg - lg.mean(-1, keepdim=True)
            cache[(i, pow2)] = torch.exp2(lg.round() if pow2 else lg)[None, :, None, :]
        return cache[(i, pow2)]

    F.fake_quantize = fq
    rows = []
    cases = [(f"{s},{BASE}", None) for s in SPLIT] + [(f"{KEY},{BASE}", t) for t in TRANSFORMS]
    if a.winners:
        import csv
        with open(Path(__file__).resolve().parents[1] / "sweeps/results/quality/winners.csv") as f:
            wins = [r["scheme"] for r in csv.DictReader(f) if r["model"].startswith("SmolLM2")
                    and "sink 4; 17 candidates" in r["budget_bits"]]
        cases = [(w, t) for w in wins for t in (None, "smooth")]
    if a.smoothing_variants:
        import csv
        with open(Path(__file__).resolve().parents[1] / "sweeps/results/quality/winners.csv") as f:
            w = [r["scheme"] for r in csv.DictReader(f) if r["model"].startswith("SmolLM2")
                 and "sink 4; 17 candidates" in r["budget_bits"] and float(r["eff_bits"]) < 3.0][0]
        sch0 = as_scheme(w)  # the K specs of the scheme and of every override gain ':smooth'
        parts = [f"k={sch0.k}:smooth,v={sch0.v},window={sch0.window},sink={sch0.sink}"]
        parts += [f"L{l}={ks}:smooth|{vs}" for l, ks, vs in sch0.overrides]
        smoothed = ",".join(parts)
        cases = [(w, None), (smoothed, None), (smoothed, "searched strength"), (w, "pair"), (w, "pair-pow2")]
    for text, t in cases:
        sch = as_scheme(text)
        mode["searched"] = t == "searched strength"
        t = None if mode["searched"] else t
        mode["t"] = t
        calib = calibrate(model, ct[None], sch, smooth_search=mode["searched"])
        if t is not None:
            calib = {i: {**calib.get(i, {}), "k": {**calib.get(i, {}).get("k", {}), "probe": i}} for i in range(n)}
        t0 = time.time()
        res = score_segments(model, segs, sch, calib)
        d, kl = [r["ppl_delta_pct"] for r in res], [r["kl"] for r in res]
        label = "smooth option, strength searched" if mode["searched"] else "smooth option"
        row = {"scheme": str(sch), "transform": t or (label if sch.k.smooth else "none"),
               "ppl_delta_pct": statistics.fmean(d),
               "ppl_delta_pct_sd": statistics.stdev(d) if len(d) > 1 else 0.0, "kl": statistics.fmean(kl),
               "segments": a.segments, "tokens": 2048, "text": "pydoc", "calib_text": "license",
               "seconds": round(time.time() - t0, 1)}
        rows.append(row)
        print(f"{text[:60]:60s} {row['transform']:14s} PPL {row['ppl_delta_pct']:+7.2f}% +- {row['ppl_delta_pct_sd']:.2f}"
              f"  KL {row['kl']:.4f}", flush=True)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    out.with_suffix(".txt").write_text("\n".join(
        f"{r['scheme'][:60]:60s} {r['transform']:14s} PPL {r['ppl_delta_pct']:+7.2f}% +- {r['ppl_delta_pct_sd']:.2f}"
        f"  KL {r['kl']:.4f}" for r in rows) + "\n")


if __name__ == "__main__":
    main()
