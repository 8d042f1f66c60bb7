"""One table from the Nsight Compute CSVs that `benchmarks/profile_decode.sh` writes.

    python benchmarks/ncu_summary.py sweeps/results/h200/profile-2026-11-30/ncu_*.csv

Columns: kernel time, DRAM throughput, issue activity, occupancy, registers, shared memory,
warp instructions, shared-memory wavefronts and the stall reasons (cycles per issued instruction)
above 0.3.
"""
from __future__ import annotations

import csv
import os
import sys

ROWS = [("Duration", "duration_us", 1e-3), ("DRAM Throughput", "dram_pct", 1), ("No Eligible", "no_eligible_pct", 1),
        ("Achieved Occupancy", "occupancy_pct", 1), ("Registers Per Thread", "regs", 1),
        ("Dynamic Shared Memory Per Block", "smem_kb", 1 / 1024), ("Waves Per SM", "waves", 1),
        ("smsp__inst_executed.sum", "warp_instr_M", 1e-6),
        ("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum", "smem_ld_wavefronts_M", 1e-6),
        ("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum", "smem_st_wavefronts_M", 1e-6)]
STALL = "smsp__average_warps_issue_stalled_"


def read(path: str) -> dict[str, float]:
    out = {}
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]  # ncu and the driver also print plain lines
        for r in csv.DictReader(lines):
            try:
                out.setdefault(r["Metric Name"], float(r["Metric Value"].replace(",", "")))
            except (KeyError, ValueError):
                continue
    return out


def main(paths: list[str]) -> None:
    for p in paths:
        m = read(p)
        name = os.path.basename(p)[len("ncu_"):-len(".csv")]
        cols = [f"{label}={m[key] * k:.3g}" for key, label, k in ROWS if key in m]
        stalls = sorted(((v, k[len(STALL):].split("_per_issue")[0]) for k, v in m.items() if k.startswith(STALL)),
                        reverse=True)
        print(f"{name}: " + ", ".join(cols))
        print("    stalls/issue: " + ", ".join(f"{k} {v:.2f}" for v, k in stalls if v >= 0.3 and k != "selected"))


if __name__ == "__main__":
    main(sys.argv[1:])
