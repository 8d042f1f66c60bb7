"""`python -m kvlab`: the preset table (name, canonical text, bits/element, round-trip error)."""
from __future__ import annotations

import argparse


def preset_rows(dist: str = "student_t4", n: int = 4096, d: int = 128, seed: int = 0) -> list[dict]:
    """One row per preset: canonical text, stored bits/element, rel-L1 and SQNR on `dist`."""
    from .eval import roundtrip_scheme
    from .spec import ALL_PRESETS, scheme
    rows = []
    for name in ALL_PRESETS:
        s = scheme(name)
        r = roundtrip_scheme(s, dist, n, d, seed)
        rows.append({"name": name, "text": str(s), "bits_per_element": s.bits_per_element(d),
                     "bytes_per_element": s.bits_per_element(d) / 8, "rel_l1": r["rel_l1"], "sqnr_db": r["sqnr_db"]})
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m kvlab", description=__doc__)
    p.add_argument("--dist", default="student_t4", help="distribution for the round trip (default student_t4)")
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    rows = preset_rows(a.dist, a.tokens, a.head_dim, a.seed)
    print(f"kvlab presets: round trip on {a.dist}, {a.tokens} tokens x head_dim {a.head_dim}, seed {a.seed}")
    print(f"{'name':20s} {'bits/el':>8s} {'rel-L1':>8s} {'SQNR dB':>8s}  canonical text")
    for r in rows:
        print(f"{r['name']:20s} {r['bits_per_element']:8.3f} {r['rel_l1']:8.4f} {r['sqnr_db']:8.2f}  {r['text']}")


if __name__ == "__main__":
    main()
