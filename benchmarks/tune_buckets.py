"""Tune decode configs across batch buckets for the main shape (issue 16: the tuned key covers B buckets 1..256).

    python benchmarks/tune_buckets.py --out DIR [--schemes fp8_e4m3,q8_0,q4_0,q4_1,int4_had] [--budget 480]

For each scheme and bucket B in 1..256 (Hq 32, Hk 8, D 128, page 16; context 32K, 16K above B=64: the key
holds no context), `kvlab.kernels.autotune.tune` searches the Gluon MMA-fragment space and then the split
counts around its best, and records the winner in DIR/tuned_configs.json (the file the package ships is built
from it). Stops starting new keys after --budget seconds. Prints one line per key.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCHEMES = {"fp8_e4m3": "fp8_e4m3", "q8_0": "q8_0", "q4_0": "q4_0", "q4_1": "q4_1", "int4_had": "int4:g32:asym:rot=had"}
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--budget", type=float, default=480)
    a = ap.parse_args(argv)
    import kvlab
    from kvlab.kernels import autotune, tuned
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tuned.set_cache_path(str(out / "tuned_configs.json"))
    t0, rows = time.time(), []
    for name in a.schemes.split(","):
        sch = kvlab.scheme(SCHEMES[name])
        for B in BUCKETS:
            if time.time() - t0 > a.budget:
                print(f"{name} B{B}: skipped (budget)", flush=True)
                continue
            shape = dict(batch=B, heads_q=32, heads_kv=8, head_dim=128, page_size=16,
                         context=32768 if B <= 64 else 16384)
            cands = autotune.gluon_space(sch, B, 32, 8, 128, 16, "cuda")
            t1 = time.time()
            try:
                cfg, ms = autotune.tune("decode", sch, shape, candidates=cands or None, save=True)
                rows.append({"scheme": name, "batch": B, "context": shape["context"], "ms": ms,
                             "config": cfg.to_dict(), "seconds": round(time.time() - t1, 1)})
                print(f"{name} B{B}: {ms:.4f} ms {json.dumps(cfg.to_dict())} ({time.time() - t1:.0f} s)", flush=True)
            except Exception as e:  # noqa: BLE001 - one key must not end the run
                print(f"{name} B{B}: {type(e).__name__}: {str(e)[:200]}", flush=True)
    (out / "buckets.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
