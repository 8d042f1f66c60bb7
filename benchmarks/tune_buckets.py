"""Tune decode configs across batch buckets (issue 16: the tuned key covers B buckets 1..256).

    python benchmarks/tune_buckets.py --out DIR [--schemes fp8_e4m3,q8_0,q4_0,q4_1,int4_had] [--budget 480]
    python benchmarks/tune_buckets.py --out DIR --shape smollm2 --batches 1,16,64 \
                                      --schemes bf16,fp8_e4m3,q8_0,q4_0,kivi4
    python benchmarks/tune_buckets.py --out DIR --shape gemma3 --batches 32 \
                                      --schemes "lm3:rot=had;k=int3:g32:chan:asym,v=int3:g32:asym"

main shape: for each scheme and bucket B in 1..256 (Hq 32, Hk 8, D 128, page 16 or a channel-axis key's token group;
context 32K, 16K above B=64:
the key holds no context), `kvlab.kernels.autotune.tune` searches the Gluon MMA-fragment space and then the
split counts around its best. smollm2 shape (Hq 9, Hk 3, D 64, the page `kvlab.generate` uses, context 8K:
what generation decodes): the Triton kernel's wide space (`wide_space`: tiles 32..256 tokens, 2..8 warps,
tensor-core and FMA dots, the fp16 fast paths, split counts from the auto one up to 8x) and the Gluon space, then splits around
the best. gemma3 shape (Hq 4, Hk 1, D 256, context 8K): the same wide space at its heads and head dim. --schemes
takes names of the table below or scheme text; separate them with ';' when any has a comma. Winners go to DIR/tuned_configs.json (the file the package ships is built from it). Stops starting
new keys after --budget seconds. Prints one line per key.
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
SCHEMES.update({"bf16": "bf16", "kivi4": "kivi4", "kivi2": "kivi2", "int2": "int2:g32:asym", "mxfp4": "mxfp4",
                "nvfp4": "nvfp4", "nf4": "nf4", "iq4nl": "iq4nl", "int3": "int3:g32:asym"})
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def wide_space(sch, B: int, Hk: int, Hq: int | None = None, D: int = 64) -> list:
    """Triton decode candidates for small head dims and GQA groups (SmolLM2: D 64, 3 query heads per KV head;
    Gemma 3: D 256, 4 query heads on 1 KV head)."""
    from kvlab.kernels.autotune import rowfirst_ok
    from kvlab.kernels.configs import TritonDecodeConfig, auto_splits
    S = auto_splits(B, Hk, "cuda")
    out = []
    for bn, w, st in ((32, 2, 2), (64, 2, 2), (64, 4, 2), (64, 4, 3), (128, 4, 2), (128, 8, 2), (256, 8, 2)):
        for dot in (None, "fma"):
            out.append(TritonDecodeConfig(block_n=bn, num_warps=w, num_stages=st, num_splits=S, asm=True, dot=dot))
    if any(rowfirst_ok(s) for s in (sch.k, sch.v)):
        out += [TritonDecodeConfig(block_n=bn, num_warps=4, num_splits=S, asm=True, layout="rowfirst")
                for bn in (64, 128)]
    out += [c.replace(num_splits=min(256, S * m)) for c in out[:4] for m in (2, 4, 8)]
    from kvlab.generate.__main__ import page_size_for
    from kvlab.kernels.autotune import gluon_space
    return out + gluon_space(sch, B, Hq or 3 * Hk, Hk, D, page_size_for(sch), "cuda")  # where the MMA kernel runs


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--budget", type=float, default=480)
    ap.add_argument("--shape", default="main", choices=["main", "smollm2", "gemma3"])
    ap.add_argument("--batches", default=",".join(map(str, BUCKETS)))
    a = ap.parse_args(argv)
    import kvlab
    from kvlab.kernels import autotune, tuned
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tuned.set_cache_path(str(out / "tuned_configs.json"))
    t0, rows = time.time(), []
    from kvlab.generate.__main__ import page_size_for
    for name in a.schemes.split(";" if ";" in a.schemes else ","):
        sch = kvlab.scheme(SCHEMES.get(name, name))
        for B in (int(b) for b in a.batches.split(",")):
            if time.time() - t0 > a.budget:
                print(f"{name} B{B}: skipped (budget)", flush=True)
                continue
            if a.shape == "smollm2":
                shape = dict(batch=B, heads_q=9, heads_kv=3, head_dim=64, page_size=page_size_for(sch), context=8192)
                cands = wide_space(sch, B, 3)
            elif a.shape == "gemma3":
                shape = dict(batch=B, heads_q=4, heads_kv=1, head_dim=256, page_size=page_size_for(sch), context=8192)
                cands = wide_space(sch, B, 1, 4, 256)
            else:
                P = page_size_for(sch)  # 16; channel-axis keys: their token group
                shape = dict(batch=B, heads_q=32, heads_kv=8, head_dim=128, page_size=P,
                             context=32768 if B <= 64 else 16384)
                cands = autotune.gluon_space(sch, B, 32, 8, 128, P, "cuda")
            t1 = time.time()
            try:
                default = autotune.tune("decode", sch, shape, candidates=[autotune._default(
                    "decode", B, shape["heads_kv"], "cuda")], save=False, search_splits=False)[1]
                cfg, ms = autotune.tune("decode", sch, shape, candidates=cands or None, save=True)  # replaces it
                rows.append({"scheme": name, "batch": B, "context": shape["context"], "ms": ms, "default_ms": default,
                             "config": cfg.to_dict(), "seconds": round(time.time() - t1, 1)})
                print(f"{name} B{B}: {ms:.4f} ms (Triton default {default:.4f}) {json.dumps(cfg.to_dict())} "
                      f"({time.time() - t1:.0f} s)", flush=True)
            except Exception as e:  # noqa: BLE001 - one key must not end the run
                print(f"{name} B{B}: {type(e).__name__}: {str(e)[:200]}", flush=True)
    (out / "buckets.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
