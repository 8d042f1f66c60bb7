"""Passkey at 8,000 tokens of the smoothed 2.5-bit SmolLM2 winner (the 21-candidate row of winners.csv), with its
key smoothing factors as calibrated (per channel, on the passkey's 512 license tokens), tied within RoPE pairs
(c, c + D/2: the geometric mean of the two, which RoPE's rotation of a pair leaves meaningful at any position), and
per channel from 2,048 calibration tokens. The factors are replaced after `calibrate` (the winner's e4m3 group
scales need nothing fitted after them).

    python benchmarks/passkey_smoothing.py OUT.json     (about 1 h on 2 cores)
"""
import csv
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import kvlab.eval.passkey as pk  # noqa: E402
from kvlab.eval.faithful import calibrate as _cal  # noqa: E402
from kvlab.model import load_model  # noqa: E402


def tied(model, tokens, sch, **kw):
    """calibrate(), then each layer's key smoothing factors [Hk, 1, D] tied within RoPE pairs (c, c + D/2)."""
    out = _cal(model, tokens, sch, **kw)
    for layer in out.values():
        s = layer.get("k", {}).get("smooth")
        if s is not None:
            D = s.shape[-1]
            g = (s[..., :D // 2] * s[..., D // 2:]).sqrt()
            layer["k"]["smooth"] = torch.cat([g, g], -1)
    return out


def main(out_path: str) -> int:
    rows = [r for r in csv.DictReader(open(ROOT / "sweeps/results/quality/winners.csv"))
            if "21 candidates" in r["budget_bits"] and r["budget"] == "2.5"]
    scheme = rows[0]["scheme"]
    model, tok = load_model("smollm2", device="cpu", dtype=torch.float32)

    def long_calib(model, tokens, sch, **kw):  # per channel, from 2,048 license tokens
        from kvlab.eval.perplexity import text_tokens
        return _cal(model, text_tokens(tok, "license")[:2048][None], sch, **kw)

    res = {}
    for name, fn in (("per-channel (512 calibration tokens)", _cal), ("RoPE-pair-tied", tied),
                     ("per-channel, 2048 calibration tokens", long_calib)):
        pk.calibrate = fn
        t0 = time.time()
        r = pk.passkey(model, tok, scheme, lengths=(8000,))
        res[name] = {"hits": r["hits"], "trials": r["trials"], "detail": r["detail"], "seconds": round(time.time() - t0)}
        print(name, r["hits"], "/", r["trials"], round(time.time() - t0), "s", flush=True)
        Path(out_path).write_text(json.dumps({"scheme": scheme, "rows": res}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
