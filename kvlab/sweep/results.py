"""Results of a sweep: an append-only JSONL journal (one fsync'd line per finished cell) from which
`results.parquet` and `results.csv` are rebuilt atomically (write a temp file, then rename).

A sweep killed at any moment loses at most the cells still running: a torn last journal line is
ignored on reading, and the tables are never half-written.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

JOURNAL = "cells.jsonl"
VOLATILE = ("date", "elapsed_s", "run_id")  # columns that differ between otherwise identical runs


def run_metadata(device: str, seed: int) -> dict:
    """Commit, CPU/GPU name, torch/triton versions, date and seed, stamped on every row."""
    import torch
    try:
        import triton
        triton_v = triton.__version__
    except ImportError:
        triton_v = None
    commit = os.environ.get("KVLAB_COMMIT")  # where the tree runs from a copy whose git metadata is stale
    try:
        commit = commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                          cwd=Path(__file__).resolve().parent, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    dev_name = torch.cuda.get_device_name() if device == "cuda" else (platform.processor() or platform.machine())
    return {"commit": commit, "device": device, "device_name": dev_name, "torch": torch.__version__,
            "triton": triton_v, "seed": seed}


class SweepResults:
    """One sweep's results directory."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.journal = self.dir / JOURNAL

    def rows(self) -> list[dict]:
        """Finished rows (a torn last line from a killed run is skipped)."""
        if not self.journal.exists():
            return []
        out = []
        with open(self.journal) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return out

    def done_ids(self) -> set[str]:
        return {r["cell_id"] for r in self.rows()}

    def append(self, row: dict) -> None:
        """Append one finished cell durably."""
        row = {**row, "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        line = json.dumps(row, default=float) + "\n"
        torn = False
        if self.journal.exists() and self.journal.stat().st_size:
            with open(self.journal, "rb") as f:  # a run killed mid-write leaves a line without its newline
                f.seek(-1, os.SEEK_END)
                torn = f.read(1) != b"\n"
        with open(self.journal, "a") as f:
            f.write(("\n" if torn else "") + line)
            f.flush()
            os.fsync(f.fileno())

    def reset(self) -> None:
        for name in (JOURNAL, "results.parquet", "results.csv"):
            (self.dir / name).unlink(missing_ok=True)

    def table(self) -> pd.DataFrame:
        """All finished rows as a DataFrame ordered by cell index (latest row per cell)."""
        rows = self.rows()
        if not rows:
            return pd.DataFrame()
        df = pd.DataFrame(rows).drop_duplicates("cell_id", keep="last")
        return df.sort_values("index", kind="stable").reset_index(drop=True)

    def write_tables(self) -> pd.DataFrame:
        """Rebuild results.parquet and results.csv atomically from the journal."""
        df = self.table()
        for name, write in (("results.parquet", lambda p: df.to_parquet(p, index=False)),
                            ("results.csv", lambda p: df.to_csv(p, index=False))):
            tmp = self.dir / f".{name}.tmp"
            write(tmp)
            os.replace(tmp, self.dir / name)
        return df
