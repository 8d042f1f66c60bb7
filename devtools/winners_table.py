"""Build sweeps/results/quality/winners.csv from search results (issue 18): one row per searched budget.

    python devtools/winners_table.py --search sweeps/results/quality/search-smollm2-mix [--search DIR ...]
                                     --pairs sweeps/results/h200/runs/winners-6a40908/pairs.csv
                                     [--out sweeps/results/quality/winners.csv]

Each DIR/search.json row gives the chosen scheme, its held-out evaluation (PPL delta +- sd over segments, KL,
effective bits) and both texts; decode_ms_h200 is one decode step's attention summed over the model's layers from
the GPU pairs table (benchmarks/winners_decode.py; empty where a layer's pair was not timed). budget_bits says how the
budget counted bits, and names the decode-time budget when the search had one; bf16_decode_ms_h200 is the same step
with a bf16 cache, from the same table.
"""
from __future__ import annotations

import argparse
import csv
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ["model", "scheme", "eff_bits", "ppl_delta_pct", "ppl_delta_pct_sd", "kl", "segments", "tokens", "text",
           "calib_text", "decode_ms_h200", "budget", "budget_bits", "source", "bf16_decode_ms_h200"]
NAMES = {"smollm2": "SmolLM2-135M-Instruct", "gemma3": "Gemma-3-270M"}


def _winners_decode():
    spec = importlib.util.spec_from_file_location("winners_decode", ROOT / "benchmarks" / "winners_decode.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rows_of(search_dir: Path) -> list[dict]:
    """winners.csv rows of one search's search.json (decode_ms_h200 not yet filled)."""
    runs = json.loads((search_dir / "search.json").read_text())
    out = []
    for r in runs:
        if "eval" not in r:  # an infeasible budget (search.json says why): no winner
            continue
        ev = r["eval"]
        kind = "effective" if r.get("context") else "nominal"
        if r.get("window"):
            kind += f"; window {r['window']}"
        if r.get("sink"):
            kind += f"; sink {r['sink']}"
        if r.get("candidates"):
            kind += f"; {len(r['candidates'])} candidates"
            if any("smooth=pair" in c for c in r["candidates"]):
                kind += "; keys smoothed per RoPE pair"
        if r.get("decode_budget_ms") is not None:
            kind += f"; decode <= {r['decode_budget_ms']:.4f} ms ({Path(r.get('speed_table', '')).parent.name})"
        out.append({"model": NAMES.get(r["model"], r["model"]), "scheme": ev["scheme"],
                    "eff_bits": round(ev["eff_bits_per_element"], 4), "ppl_delta_pct": round(ev["ppl_delta_pct"], 3),
                    "ppl_delta_pct_sd": round(ev["ppl_delta_pct_sd"], 3), "kl": round(ev["kl"], 5),
                    "segments": ev["segments"], "tokens": ev["tokens"], "text": ev["text"],
                    "calib_text": r["calib_text"], "budget": r["budget"], "budget_bits": kind,
                    "source": str((search_dir / "search.json").relative_to(ROOT)
                                  if search_dir.resolve().is_relative_to(ROOT) else search_dir / "search.json")})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--search", action="append", required=True)
    p.add_argument("--pairs", required=True)
    p.add_argument("--out", default=str(ROOT / "sweeps/results/quality/winners.csv"))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--context", type=int, default=8192)
    a = p.parse_args(argv)
    wd = _winners_decode()
    rows = [row for d in a.search for row in rows_of(Path(d).resolve())]
    times = wd.read_pairs(a.pairs)
    timed = wd.summarize([r for r in rows if r["model"] in wd.MODELS], times, {}, a.batch, a.context)
    ms = {(t["model"], t["scheme"]): (t.get("decode_ms_h200"), t.get("bf16_ms")) for t in timed}
    for r in rows:
        v, ref = ms.get((r["model"], r["scheme"]), (None, None))
        r["decode_ms_h200"] = "" if v is None else round(v, 4)
        r["bf16_decode_ms_h200"] = "" if ref is None else round(ref, 4)  # a bf16 cache's step in the same table
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    print(f"{len(rows)} rows -> {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
