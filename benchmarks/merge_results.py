"""Merge a device run's result tables into a GPU's committed tables: rows keyed by their cell replace the committed
row of the same cell, new cells are appended, every other committed row stays, and the header records where each
run's rows came from.

    python benchmarks/merge_results.py sweeps/results/h200/runs/close1-d9fe7c9            # decode.csv + store.csv
    python benchmarks/merge_results.py RUN --into sweeps/results/h100 --tables extend --dry-run

RUN is searched for decode.csv, store.csv and extend.csv (directly or one folder down, as `targets.py` does). A
cell's key (KEYS) is its scheme and shape (and dispatch / backend); the committed file keeps its columns, its row
order and "\\n" line ends. A committed `commit` column (tables mixing rows of several trees) is filled from the run's
header; --add-columns lets a run's new columns join the committed table. Refused, naming the reason, before anything
is written: a run from another GPU than the committed header's, a run table whose columns differ from the committed
one's otherwise, or a run table with one cell twice.
A run row with no value (a budget skip or an error) does not replace a committed row that has one unless
--keep-empty is given; it is counted and listed. The committed header (header.json for decode, store_header.json,
extend_header.json) takes the run's header and keeps the one it replaces under "history", with the row counts.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from targets import ROOT, _find, _rel  # noqa: E402

TABLES = ("decode", "store", "extend")
KEYS = {"decode": ("scheme", "dispatch", "batch", "context", "heads_q", "heads_kv", "head_dim", "page_size"),
        "store": ("scheme", "tokens", "backend"),
        "extend": ("scheme", "backend", "batch", "prefix", "chunk", "heads_q", "heads_kv", "head_dim", "page_size")}
VALUE = {"decode": ("graph_ms", "median_ms"), "store": ("graph_ms",), "extend": ("median_ms",)}
HEADER = {"decode": "header.json", "store": "store_header.json", "extend": "extend_header.json"}


def _read(path: Path) -> tuple[list[str], list[dict]]:
    with open(path, newline="") as f:
        r = csv.DictReader(f)
        return list(r.fieldnames or []), list(r)


def has_value(kind: str, row: dict) -> bool:
    """Whether the row holds a finite timing in one of its table's value columns."""
    for c in VALUE[kind]:
        try:
            if math.isfinite(float(row.get(c) or "nan")):
                return True
        except ValueError:
            pass
    return False


def key_of(kind: str, row: dict) -> tuple:
    """The cell a row measures. Integer-valued keys compare as numbers, so "32" and "32.0" are one cell."""
    out = []
    for c in KEYS[kind]:
        v = (row.get(c) or "").strip()
        try:
            f = float(v)
            v = str(int(f)) if f.is_integer() else v
        except ValueError:
            pass
        out.append(v)
    return tuple(out)


def merge_rows(kind: str, cols: list[str], old: list[dict], new_cols: list[str], new: list[dict],
               keep_empty: bool = False, where: str = "run", commit: str | None = None,
               add_columns: bool = False) -> tuple[list[str], list[dict], dict]:
    """The committed columns and rows `old` with the run's rows `new` merged in (see the module text); and the counts.
    A committed `commit` column the run lacks takes `commit` (the run header's); with add_columns, columns only the
    run has are appended to the committed table (empty in its earlier rows)."""
    new_cols = list(new_cols)
    if "commit" in cols and "commit" not in new_cols:
        if not commit or commit == "unknown":
            raise SystemExit(f"{where}: the committed {kind} table has a commit column and the run's header names no "
                             f"commit; merge refused")
        if len(commit) == 40 and all(ch in "0123456789abcdef" for ch in commit):
            commit = commit[:7]  # a full hash (KVLAB_COMMIT unset): the table's short form
        new = [dict(r, commit=commit) for r in new]
        new_cols.append("commit")
    gone, extra = sorted(set(cols) - set(new_cols)), [c for c in new_cols if c not in cols]
    if gone or (extra and not add_columns):
        hint = "" if gone else "; --add-columns takes them"
        raise SystemExit(f"{where}: its {kind} columns differ from the committed table's"
                         f"{' (lacks ' + ', '.join(gone) + ')' if gone else ''}"
                         f"{' (adds ' + ', '.join(extra) + hint + ')' if extra else ''}; merge refused")
    cols = cols + extra
    missing = [c for c in KEYS[kind] if c not in cols]
    if missing:
        raise SystemExit(f"{where}: not a {kind} table (no key column {', '.join(missing)})")
    seen: dict[tuple, int] = {}
    for i, r in enumerate(new):
        k = key_of(kind, r)
        if k in seen:
            raise SystemExit(f"{where}: the {kind} cell {dict(zip(KEYS[kind], k))} appears twice (rows {seen[k] + 2} "
                             f"and {i + 2}); merge refused")
        seen[k] = i
    index = {key_of(kind, r): i for i, r in enumerate(old)}
    out = [dict(r) for r in old]
    counts = {"replaced": 0, "added": 0, "kept": 0, "empty_not_merged": []}
    for r in new:
        k = key_of(kind, r)
        row = {c: r.get(c, "") for c in cols}
        if k in index:
            if not has_value(kind, r) and has_value(kind, old[index[k]]) and not keep_empty:
                counts["empty_not_merged"].append(dict(zip(KEYS[kind], k)))
                continue
            out[index[k]] = row
            counts["replaced"] += 1
        else:
            out.append(row)
            counts["added"] += 1
    counts["kept"] = len(old) - counts["replaced"]
    for r in out:
        for c in extra:
            r.setdefault(c, "")
    return cols, out, counts


def _text(cols: list[str], rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def _gpu_of_run(kind: str, table: Path, run: Path) -> tuple[dict, str | None]:
    """The run's header for this table (`<kind>_header.json`, else `header.json`, beside the table, then in the run
    folder; the first that names a GPU) and its GPU name; else no header and the first field of a gpu.txt."""
    for h in (table.parent / HEADER[kind], table.parent / "header.json", run / HEADER[kind], run / "header.json"):
        if h.is_file():
            head = json.loads(h.read_text())
            if head.get("gpu"):
                return head, head["gpu"]
    for g in (table.parent / "gpu.txt", run / "gpu.txt"):
        if g.is_file() and g.read_text().strip():
            return {}, g.read_text().split(",")[0].strip()
    return {}, None


def _gpu_of_folder(into: Path, kind: str) -> str | None:
    """The GPU a results folder's rows come from: its header for this table, else any of its headers that names one."""
    names = [into / HEADER[kind]] + sorted(p for p in into.glob("*header.json") if p.name != HEADER[kind])
    for h in names:
        if h.is_file():
            gpu = json.loads(h.read_text()).get("gpu")
            if gpu:
                return gpu
    return None


def merge(run: Path, into: Path, tables=TABLES, keep_empty: bool = False, dry_run: bool = False,
          add_columns: bool = False) -> list[str]:
    """Merge every table of `tables` that `run` holds into `into`; returns one summary line a table. Everything is
    checked before the first file is written."""
    if not run.is_dir():
        raise SystemExit(f"{run}: not a folder")
    if not into.is_dir():
        raise SystemExit(f"--into {into}: not a folder")
    plan = []
    for kind in tables:
        if kind not in TABLES:
            raise SystemExit(f"--tables: {kind!r} is not one of {', '.join(TABLES)}")
        src = _find(run, f"{kind}.csv", "pass the subfolder to merge")
        if src is None:
            continue
        head, gpu = _gpu_of_run(kind, src, run)
        dst, dst_head_path = into / f"{kind}.csv", into / HEADER[kind]
        old_head = json.loads(dst_head_path.read_text()) if dst_head_path.is_file() else {}
        if gpu is None:
            raise SystemExit(f"{_rel(src)}: no header ({HEADER[kind]}, header.json) or gpu.txt says which GPU ran it; "
                             f"merge refused")
        held = _gpu_of_folder(into, kind)
        if held is None and dst.is_file():
            raise SystemExit(f"{_rel(dst)}: no header in {_rel(into)} says which GPU its rows come from; merge refused "
                             f"(write {HEADER[kind]} with its \"gpu\" first)")
        if held is not None and held != gpu:
            raise SystemExit(f"{_rel(src)} ran on {gpu!r}, {_rel(into)} holds {held!r} rows; merge it into that GPU's "
                             f"folder")
        new_cols, new = _read(src)
        cols, old = _read(dst) if dst.is_file() else (new_cols, [])
        cols, rows, counts = merge_rows(kind, cols, old, new_cols, new, keep_empty, where=_rel(src),
                                        commit=(head or {}).get("commit"), add_columns=add_columns)
        plan.append((kind, src, dst, dst_head_path, head, gpu, old_head, cols, rows, counts))
    if not plan:
        raise SystemExit(f"{run}: no {', '.join(t + '.csv' for t in tables)} in it or one folder down")
    lines = []
    for kind, src, dst, dst_head_path, head, gpu, old_head, cols, rows, counts in plan:
        skipped = counts["empty_not_merged"]
        lines.append(f"{kind}: {_rel(src)} -> {_rel(dst)}: {counts['replaced']} replaced, {counts['added']} added, "
                     f"{counts['kept']} kept" + (f", {len(skipped)} run rows without a value not merged "
                                                 f"({'; '.join(' '.join(map(str, s.values())) for s in skipped)})"
                                                 if skipped else ""))
        if dry_run:
            continue
        dst.write_text(_text(cols, rows))
        hist = old_head.pop("history", [])
        new_head = dict(head or {"gpu": gpu})
        new_head["rows"] = (f"{counts['replaced'] + counts['added']} rows from {_rel(src.parent)}; "
                            f"{counts['kept']} earlier rows kept (earlier headers under history)")
        new_head["history"] = ([old_head] if old_head else []) + hist
        dst_head_path.write_text(json.dumps(new_head, indent=1) + "\n")
    return lines


def main(argv=None) -> list[str]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="the run folder (device output copied under sweeps/results/<gpu>/runs/)")
    ap.add_argument("--into", default=str(ROOT / "sweeps" / "results" / "h200"), help="the GPU's results folder")
    ap.add_argument("--tables", default=",".join(TABLES), help="comma-separated, of decode, store, extend")
    ap.add_argument("--keep-empty", action="store_true", help="let a run row without a value replace one with a value")
    ap.add_argument("--dry-run", action="store_true", help="print what would change, write nothing")
    ap.add_argument("--add-columns", action="store_true",
                    help="columns only the run has join the committed table (empty in its earlier rows)")
    a = ap.parse_args(argv)
    lines = merge(Path(a.run), Path(a.into), [t for t in a.tables.split(",") if t], a.keep_empty, a.dry_run,
                  a.add_columns)
    print("\n".join(lines))
    return lines


if __name__ == "__main__":
    main()
