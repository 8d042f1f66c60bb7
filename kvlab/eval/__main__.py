"""`python -m kvlab.eval`: score schemes on a real model through a decode-faithful quantized cache.

    python -m kvlab.eval --scheme q4_0 --scheme kivi4 [--model smollm2|PATH] [--tokens 2048]
                         [--segments 4] [--text pydoc|license] [--device cpu|cuda] [--json FILE]

One row per scheme: bits/element, effective bits/element (full-precision window and sinks
amortized over the evaluated length, per-layer overrides included), PPL, PPL delta % +- sd over
segments, KL(full || quantized), top-1 agreement, greedy agreement, passkey hits.
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvlab.eval", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scheme", action="append", required=True, help="scheme text or preset (repeat for several)")
    p.add_argument("--model", default="smollm2", help="smollm2 (embedded GGUF), a .gguf path or an HF directory")
    p.add_argument("--tokens", type=int, default=2048, help="tokens per segment (default 2048)")
    p.add_argument("--segments", type=int, default=4, help="disjoint segments (mean +- sd over them; default 4)")
    p.add_argument("--text", default="pydoc", choices=["pydoc", "license"])
    p.add_argument("--seed", type=int, default=0, help="0: the first segments in order; else a seeded choice")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="model dtype (default float32: in bf16 rounding noise floors KL near 2e-3)")
    p.add_argument("--greedy", type=int, default=16, help="greedy tokens compared per segment (0: skip)")
    p.add_argument("--passkey", default="512,1024", help="comma-separated passkey lengths ('' to skip)")
    p.add_argument("--json", help="write the rows as JSON to this file")
    p.add_argument("--bos", action=argparse.BooleanOptionalAction, default=None,
                   help="start segments with the BOS token (default: where the model's tokenizer adds one)")
    return p


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    import torch
    from tqdm import tqdm

    from ..model import load_model
    from ..spec import as_scheme
    from .passkey import passkey
    from .perplexity import evaluate_scheme
    try:
        schemes = [as_scheme(s) for s in a.scheme]
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device is visible", file=sys.stderr)
        return 2
    dtype = getattr(torch, a.dtype)
    t0 = time.time()
    model, tok = load_model(a.model, device=a.device, dtype=dtype)
    lengths = tuple(int(x) for x in a.passkey.split(",") if x.strip())
    rows = []
    with tqdm(total=len(schemes) * a.segments, desc="segments", unit="seg", file=sys.stderr) as bar:
        for s in schemes:
            try:
                r = evaluate_scheme(model, tok, s, text=a.text, n_tokens=a.tokens, n_segments=a.segments,
                                    seed=a.seed, greedy_tokens=a.greedy, progress=lambda: bar.update(1), bos=a.bos)
                if lengths:
                    pk = passkey(model, tok, s, lengths=lengths, seed=a.seed)
                    r["passkey_hits"], r["passkey_trials"] = pk["hits"], pk["trials"]
            except ValueError as e:
                print(f"error: scheme {s}: {e}", file=sys.stderr)
                return 2
            rows.append(r)
    print(f"model {a.model} on {a.device} ({dtype}); text {a.text}, {a.segments} x {a.tokens} tokens, seed {a.seed}; "
          f"decode-faithful; {time.time() - t0:.1f} s")
    print(f"{'scheme':48s} {'bits':>5s} {'eff':>5s} {'PPL':>7s} {'dPPL%':>14s} {'KL':>15s} {'top1':>6s} {'greedy':>6s} {'pk':>5s}")
    for r in rows:
        pk = f"{r['passkey_hits']}/{r['passkey_trials']}" if "passkey_hits" in r else "-"
        gr = f"{r['greedy_agree']:.1f}" if "greedy_agree" in r else "-"
        print(f"{(r['name'] or r['scheme'])[:48]:48s} {r['bits_per_element']:5.2f} {r['eff_bits_per_element']:5.2f} "
              f"{r['ppl']:7.3f} {r['ppl_delta_pct']:+6.2f}+-{r['ppl_delta_pct_sd']:<5.2f} "
              f"{r['kl']:.4f}+-{r['kl_sd']:.4f} {r['top1']:6.3f} {gr:>6s} {pk:>5s}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "device": a.device, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
