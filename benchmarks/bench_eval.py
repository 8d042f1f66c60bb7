"""Time one scheme's decode-faithful evaluation (PPL, KL, top-1) on SmolLM2.

    python benchmarks/bench_eval.py --device cpu  --tokens 2048    # target: <= 60 s, model load included
    python benchmarks/bench_eval.py --device cuda --tokens 8192    # target: <= 5 s per scheme

Prints load time, the first evaluation (includes warm-up) and the median of the next runs.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--scheme", default="q4_0")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="write the numbers here")
    a = ap.parse_args()
    t0 = time.perf_counter()
    from kvlab.eval.perplexity import evaluate_scheme
    from kvlab.model import load_model
    model, tok = load_model("smollm2", device=a.device, dtype=torch.float32)  # as the sweep evaluates
    t_load = time.perf_counter() - t0

    def once() -> tuple[float, dict]:
        from kvlab.eval import perplexity
        perplexity._REF_CACHE.clear()  # time the full-precision reference pass too
        if a.device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        r = evaluate_scheme(model, tok, a.scheme, n_tokens=a.tokens, n_segments=1)
        if a.device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t, r

    first, r = once()
    rest = [once()[0] for _ in range(max(0, a.repeats - 1))]
    out = {"device": a.device, "device_name": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
           "scheme": a.scheme, "tokens": a.tokens, "load_s": t_load, "first_eval_s": first,
           "median_eval_s": statistics.median(rest) if rest else first, "load_plus_first_s": t_load + first,
           "ppl": r["ppl"], "ppl_ref": r["ppl_ref"], "kl": r["kl"], "torch": torch.__version__}
    print(json.dumps(out, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
