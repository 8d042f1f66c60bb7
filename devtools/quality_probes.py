"""Quality probes (issue 18): techniques tried on SmolLM2 before (or instead of) making them scheme options.

    python devtools/quality_probes.py --json sweeps/results/quality/probes.json [--model smollm2] [--tokens 1024]
                                      [--segments 2]

Each probe runs the decode-faithful backend with one layer-wide transform, calibrated on the license text and
scored on pydoc (the CLI's segments): PPL delta and KL against the full-precision model, one row per variant.
- smooth_k: SmoothQuant-style per-channel key smoothing folded into the queries (K / s, q * s, exact in full
  precision; s shared by each RoPE pair so it commutes with RoPE): s = amax|K_c|^a / amax|q_c|^(1-a).
- smooth_v: per-channel value smoothing folded into the output (V / s, out * s).
- outliers: the n largest-magnitude elements of each token vector kept in full precision (dense-and-sparse).
- static_chan: keys quantized with per-channel min/max calibrated offline (no group scales, KVQuant's layout).
These are probes, not scheme options: their numbers say whether a technique earns its place on this model.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvlab.eval.faithful import DecodeFaithfulBackend, faithful_attention, quantized_history  # noqa: E402
from kvlab.eval.perplexity import bos_prefix, reference_logits, segments, text_tokens  # noqa: E402
from kvlab.quant import fake_quantize  # noqa: E402
from kvlab.spec import as_scheme, as_spec  # noqa: E402


class Probe(DecodeFaithfulBackend):
    """The decode-faithful backend with per-layer key/value smoothing and per-tensor codecs (callables x -> x')."""

    def __init__(self, scheme, n_layers, sk=None, sv=None, kcodec=None, vcodec=None):
        super().__init__(scheme, n_layers)
        self.sk, self.sv, self.kcodec, self.vcodec = sk, sv, kcodec, vcodec

    def attend(self, layer, q, k_pre, k, v, positions, model):
        r = q.shape[1] // k.shape[1]
        if self.sk is not None:
            s = self.sk[layer][None, :, None, :]
            q, k, k_pre = q * s.repeat_interleave(r, 1), k / s, k_pre / s
        if self.sv is not None:
            v = v / self.sv[layer][None, :, None, :]
        k_pos = positions
        ks, vs = self.scheme.for_layer(layer, self.n_layers)
        kc = self.kcodec(layer) if self.kcodec else None
        vc = self.vcodec(layer) if self.vcodec else None
        kq = quantized_history(k_pre if ks.pre_rope else k, ks, self.scheme, None, None, kc)
        vq = quantized_history(v, vs, self.scheme, None, None, vc)
        if ks.pre_rope:
            kq = model.apply_rope(kq, k_pos, max_position=model.rope_positions - 1)
        out = faithful_attention(q, k, v, kq, vq, positions, k_pos, ks, vs, self.policy, self.q_chunk,
                                 sliding_window=getattr(model.config, "sliding_window", None))
        if self.sv is not None:
            out = out * self.sv[layer].repeat_interleave(r, 0)[None, :, None, :]
        return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", required=True)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--segments", type=int, default=2)
    a = p.parse_args(argv)
    from kvlab.model import load_model
    torch.manual_seed(0)
    model, tok = load_model(a.model)
    c = model.config
    n, D, Hk = c.n_layers, c.head_dim, c.n_kv_heads
    pre = bos_prefix(tok)
    cap = model.capture(segments(text_tokens(tok, "license"), a.tokens, 1, prefix=pre)[0][None])
    segs = segments(text_tokens(tok, "pydoc"), a.tokens, a.segments, prefix=pre)
    rows = []

    def pairmax(t):  # a RoPE pair (c, c + D/2) shares one value
        m = torch.maximum(t[..., :D // 2], t[..., D // 2:])
        return torch.cat([m, m], -1)

    def smooth_k(alpha):
        out = []
        for i in range(n):
            km = pairmax(cap["k"][i][0].abs().amax(1))
            qm = pairmax(cap["q"][i][0].reshape(Hk, -1, D).abs().amax(1))
            s = km.clamp_min(1e-5) ** alpha / qm.clamp_min(1e-5) ** (1 - alpha)
            out.append(s / s.mean(-1, keepdim=True))
        return out

    def smooth_v(alpha):
        out = []
        for i in range(n):
            s = cap["v"][i][0].abs().amax(1).clamp_min(1e-5) ** alpha
            out.append(s / s.mean(-1, keepdim=True))
        return out

    def outliers(spec_text, slots):
        sp = as_spec(spec_text)

        def f(x):
            idx = x.abs().topk(slots, dim=-1).indices
            keep = torch.gather(x, -1, idx)
            return fake_quantize(x.scatter(-1, idx, 0.0), sp).float().scatter(-1, idx, keep)
        return lambda layer: f

    def static_chan(bits, pre):
        tabs = [((cap["k_pre"] if pre else cap["k"])[i][0].amin(1), (cap["k_pre"] if pre else cap["k"])[i][0].amax(1))
                for i in range(n)]

        def codec(layer):
            lo, hi = (t[None, :, None] for t in tabs[layer])
            s = (hi - lo) / (2 ** bits - 1)
            return lambda x: ((x - lo) / s).round().clamp(0, 2 ** bits - 1) * s + lo
        return codec

    def run(probe, variant, scheme, bits_note="", **kw):
        t0 = time.time()
        sch = as_scheme(scheme)
        lgs = model(torch.stack(segs), backend=Probe(sch, n, **kw))
        dps, kls = [], []
        for seg, lg in zip(segs, lgs):
            ref = reference_logits(model, seg)
            a_, b_ = lg[:-1].float(), ref.logits[:-1].float()
            nll = F.cross_entropy(a_, seg[1:]).item()
            lr, lp = F.log_softmax(b_, -1), F.log_softmax(a_, -1)
            kls.append((lr.exp() * (lr - lp)).sum(-1).mean().item())
            dps.append(100 * (float(torch.tensor(nll - ref.nll).exp()) - 1))
        row = {"probe": probe, "variant": variant, "scheme": str(sch), "ppl_delta_pct": statistics.fmean(dps),
               "ppl_delta_pct_sd": statistics.stdev(dps) if len(dps) > 1 else 0.0, "kl": statistics.fmean(kls),
               "extra_bits": bits_note, "segments": a.segments, "tokens": a.tokens, "text": "pydoc",
               "calib_text": "license"}
        rows.append(row)
        print(f"{probe:12s} {variant:28s} {row['scheme']:44s} dPPL {row['ppl_delta_pct']:+7.2f} KL {row['kl']:.4f} "
              f"({time.time() - t0:.0f}s)", flush=True)
        Path(a.json).write_text(json.dumps({"model": a.model, "rows": rows}, indent=1) + "\n")

    for ks in ("int4:g64:asym", "int3:g64:asym"):
        sch = f"k={ks},v=bf16"
        run("smooth_k", "none", sch)
        for alpha in (0.5, 0.75):
            run("smooth_k", f"alpha={alpha}", sch, sk=smooth_k(alpha))
        run("smooth_k", "rot=had instead", f"k={ks}:rot=had,v=bf16")
    run("smooth_k", "chan keys instead", "k=int4:g32:chan:asym,v=bf16")
    for vs in ("int3:g64:asym", "int2:g32:asym"):
        sch = f"k=bf16,v={vs}"
        run("smooth_v", "none", sch)
        run("smooth_v", "alpha=0.5", sch, sv=smooth_v(0.5))
        for slots in (1, 2):
            run("outliers", f"{slots} fp16 slots per token", sch, f"+{slots * 22 / D:.3f} (fp16 + 6-bit index)",
                vcodec=outliers(vs, slots))
    run("outliers", "none", "k=int2:g32:chan:asym,v=bf16")
    run("outliers", "1 fp16 slot per token", "k=int2:g32:chan:asym,v=bf16", f"+{22 / D:.3f}",
        kcodec=outliers("int2:g32:chan:asym", 1))
    for bits in (4, 3):
        for pre in (True, False):
            run("static_chan", f"int{bits} {'pre' if pre else 'post'}-RoPE",
                f"k=int4:g32:chan:asym{':prerope' if pre else ''},v=bf16",
                f"{bits} bits, no group scales", kcodec=static_chan(bits, pre))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
