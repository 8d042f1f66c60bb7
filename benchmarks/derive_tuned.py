"""A GPU's packaged decode configs from a sibling GPU's, checked cell by cell on the GPU itself.

    python benchmarks/derive_tuned.py --base kvlab/kernels/data/tuned_nvidia_h200.json --gpu "NVIDIA H100 80GB HBM3" \\
        --runs RUN/decode.csv [RUN2/decode.csv ...] [--slack 0.05] --out kvlab/kernels/data/tuned_nvidia_h100_80gb_hbm3.json

Each run is a `benchmarks/run.py --cases decode --dispatch tuned,default --tuned BASE` table measured on `--gpu`
(a GPU with no packaged file, so its `default` rows are the dispatch heuristic's). Every entry of the base file is
kept, except where a measured cell's heuristic config beat what the base file served (its entry, or for a key with
none the nearest batch bucket's config, `tuned.nearest`) by more than `--slack` (graph-replayed medians, same run):
there the heuristic's config, with its median, becomes the entry. Dropping an entry instead would not give the
heuristic back: `tuned.nearest` would serve another batch bucket's config. A key with no entry whose nearest bucket's
config beat the heuristic by more than the slack gets that config as served ("pinned"), since where few programs occupy
the SMs dispatch tries the heuristic before the nearest bucket. Entries no run
measured (other page sizes, head counts, store tiles) are kept as they are: same architecture and SM count is the
premise of deriving at all, and the runs show how far it holds. Prints one line per measured cell.

A second stage checks a packaged file against the heuristic on its own GPU: `--pair default,heuristic` over runs of
`--dispatch default,heuristic` (the `default` rows served by the packaged file for that GPU, which is then `--base`; the
`heuristic` rows by the dispatch heuristic alone), with the same rule. The shipped H100 file is stage one over the
session-31 runs, then stage two over the session-32 runs (tests/benchmarks/test_derive_tuned.py re-derives it).
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def cell_key(row: dict, scheme_specs: dict) -> str:
    """The tuned-store key a decode.csv row was dispatched under."""
    import kvlab
    from kvlab.kernels.tuned import attention_key
    sch = kvlab.scheme(scheme_specs[row["scheme"]])
    return attention_key("decode", sch.k, sch.v, int(row["batch"]), int(row["heads_q"]), int(row["heads_kv"]),
                         int(row["head_dim"]), int(row["page_size"]))


def derive(base: dict, rows: list[dict], scheme_specs: dict, slack: float,
           pair: tuple[str, str] = ("tuned", "default")) -> tuple[dict, list[str]]:
    """(the derived configs, report lines) from the base file's configs and the measured rows; `pair`: the dispatch
    names of the rows the base served and of the heuristic's rows."""
    configs = dict(base["configs"])
    cells: dict[str, dict] = {}
    for r in rows:
        if r.get("error") or not r.get("graph_ms"):
            continue
        cells.setdefault(cell_key(r, scheme_specs), {})[r["dispatch"]] = r
    lines = []
    for key, by in sorted(cells.items()):
        t, d = by.get(pair[0]), by.get(pair[1])
        if t is None or d is None:
            continue
        tm, dm = float(t["graph_ms"]), float(d["graph_ms"])
        if dm * (1 + slack) < tm:  # (a key with no entry: the base's nearest bucket served the tuned row)
            what = "replaced" if key in configs else "added"
            configs[key] = {**json.loads(d["config"]), "ms": dm}
        elif key not in configs and tm * (1 + slack) < dm:  # the nearest bucket's config won: pin what it served,
            what = "pinned"  # as dispatch may try the heuristic before `tuned.nearest` (`decode.api.candidates`)
            configs[key] = {**json.loads(t["config"]), "ms": tm}
        else:
            what = "kept" if key in configs else "none"
        lines.append(f"{what:9s} {key}: base {tm:.4f} ms, heuristic {dm:.4f} ms ({tm / dm:.3f}x)")
    return configs, lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True)
    ap.add_argument("--gpu", required=True, help="the GPU the runs measured (torch.cuda.get_device_name)")
    ap.add_argument("--runs", nargs="+", required=True)
    ap.add_argument("--slack", type=float, default=0.05, help="how much faster the heuristic must be to replace")
    ap.add_argument("--out", required=True)
    ap.add_argument("--source", default="", help="appended to the derived file's source line")
    ap.add_argument("--pair", default="tuned,default", choices=("tuned,default", "default,heuristic"),
                    help="dispatch rows the base served, then the heuristic's: tuned,default (a sibling GPU's file "
                         "passed as --tuned) or default,heuristic (the packaged file of the measured GPU itself)")
    a = ap.parse_args(argv)
    pair = tuple(a.pair.split(","))
    from run import SCHEMES  # noqa: E402 - benchmarks/run.py's scheme names (decode.csv's)
    base = json.loads(Path(a.base).read_text())
    if pair[0] == "default" and base.get("gpu") != a.gpu:
        raise SystemExit(f"--pair default,heuristic: --base must be the packaged file of {a.gpu!r} (its default "
                         f"rows' configs), got one for {base.get('gpu')!r}")
    rows = []
    for run in a.runs:
        header = json.loads((Path(run).parent / "header.json").read_text())
        tuned = header.get("tuned_file", "").split("/")[-1]
        if header.get("gpu") != a.gpu or (pair[0] == "tuned" and tuned != Path(a.base).name):
            raise SystemExit(f"{run}: measured on {header.get('gpu')!r} with tuned file {header.get('tuned_file')!r};"
                             f" this derivation needs {a.gpu!r}" + (f" with {Path(a.base).name}" if pair[0] == "tuned"
                                                                    else ""))
        with open(run) as f:
            rows += list(csv.DictReader(f))
    configs, lines = derive(base, rows, SCHEMES, a.slack, pair)
    if not lines:
        raise SystemExit(f"no measured cell has both {pair[0]!r} and {pair[1]!r} rows (run.py --dispatch {a.pair})")
    print("\n".join(lines))
    if pair[0] == "tuned":
        src = (f"derived from {Path(a.base).name} (same sm_90 architecture and SM count), checked on this GPU by "
               f"benchmarks/derive_tuned.py --slack {a.slack} over {', '.join(a.runs)}: entries whose heuristic config "
               f"ran more than {a.slack:.0%} faster than the base's pick put in its place")
    else:
        src = (f"{base.get('source', Path(a.base).name)}; then checked against the dispatch heuristic by "
               f"benchmarks/derive_tuned.py --pair default,heuristic --slack {a.slack} over {', '.join(a.runs)}, the "
               f"same rule")
    out = {"format": base["format"], "gpu": a.gpu, "source": src + (f"; {a.source}" if a.source else ""),
           "configs": configs}
    Path(a.out).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"{len(configs)} entries -> {a.out}")


if __name__ == "__main__":
    main()
