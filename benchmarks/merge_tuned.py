"""Merge tuned decode / extend / store entries into the configs the package ships for a GPU.

    python benchmarks/merge_tuned.py RUN/tuned_configs.json [--into kvlab/kernels/data/tuned_nvidia_h200.json]
                                     [--only-faster] [--source "where the entries were measured"]

Every entry of the tuned file replaces the packaged entry of the same key (with --only-faster: only where its
median is lower than the packaged one's, or the key is new). The packaged file's "source" line gains --source.
Prints one line per key: kept, added or replaced, with both medians.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def merge(tuned: dict, packaged: dict, only_faster: bool = False) -> list[str]:
    """Entries of `tuned` into `packaged` (both in the tuned-store format); -> report lines."""
    lines = []
    for key, cfg in sorted(tuned.get("configs", {}).items()):
        old = packaged["configs"].get(key)
        if old is not None and only_faster and old.get("ms", float("inf")) <= cfg.get("ms", float("inf")):
            lines.append(f"kept      {key}: packaged {old.get('ms'):.4f} ms <= tuned {cfg.get('ms'):.4f}")
            continue
        packaged["configs"][key] = cfg
        lines.append(f"{'replaced' if old else 'added':9s} {key}: {cfg.get('ms'):.4f} ms"
                     + (f" (was {old.get('ms'):.4f})" if old else ""))
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("tuned")
    ap.add_argument("--into", default=str(ROOT / "kvlab/kernels/data/tuned_nvidia_h200.json"))
    ap.add_argument("--only-faster", action="store_true")
    ap.add_argument("--source", default="")
    a = ap.parse_args(argv)
    tuned = json.loads(Path(a.tuned).read_text())
    into = Path(a.into)
    packaged = json.loads(into.read_text())
    for line in merge(tuned, packaged, a.only_faster):
        print(line)
    if a.source:
        packaged["source"] = packaged.get("source", "") + "; " + a.source
    into.write_text(json.dumps(packaged, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
