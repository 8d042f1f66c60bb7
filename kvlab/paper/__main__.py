"""python -m kvlab.paper [--out paper] [--root .] [--refresh-data]

Rebuild paper/kvlab.md, paper/figures/*.png and paper/provenance.json from the committed result files under
sweeps/results/ (no GPU, no model run). --refresh-data first recomputes the CPU-cheap result files the paper
reads (kvlab.paper.data). Exit code 2 when a result file is missing or a number in the text has no source.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvlab.paper", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", default=".", help="project root holding sweeps/results (default: .)")
    p.add_argument("--out", default="paper", help="output directory (default: paper)")
    p.add_argument("--refresh-data", action="store_true", help="recompute the CPU-cheap result files first")
    a = p.parse_args(argv)
    root = Path(a.root).resolve()
    from .build import Paper
    from .data import freetoken_roundtrip
    try:
        if a.refresh_data:
            print(f"wrote {freetoken_roundtrip(root)}")
        path = Paper(root, (root / a.out) if not Path(a.out).is_absolute() else Path(a.out)).build()
    except (FileNotFoundError, KeyError, ValueError) as e:
        print(f"python -m kvlab.paper: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
