#!/usr/bin/env bash
# Nsight Compute on the decode kernel (H200, Firecracker runtime: hardware counters readable with
# --clock-control none; METHOD.md: leave the clocks alone). For each scheme the quick tuner runs
# first in its own process (so ncu does not see its launches) and its config is passed to the
# driver, whose 3rd decode launch is the one profiled. Untested on the GPU as of 2026-11-30.
#   bash benchmarks/profile_decode.sh q4_0 q8_0 fp8_e4m3 bf16
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
for s in "$@"; do
  cfg=$(python3 - "$s" <<'PY'
import json, sys
from kvlab.kernels.tuning import tune
from kvlab.spec import scheme
shape = {"batch": 32, "heads_q": 32, "heads_kv": 8, "head_dim": 128, "page_size": 16, "context": 32768}
print(json.dumps(tune("decode", scheme(sys.argv[1]), shape, quick=True, save=False)[0]))
PY
)
  echo "== $s $cfg"
  ncu --clock-control none -k regex:_decode_kernel --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \
      --section SchedulerStats --section LaunchStats --csv --page details \
      python3 benchmarks/profile_decode.py "$s" --config "$cfg" > "$OUT/ncu_${s//[:=,]/_}.csv" 2> "$OUT/ncu_${s//[:=,]/_}.err"
  grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Stall|Issued Ipc|No Eligible|Shared Memory" \
      "$OUT/ncu_${s//[:=,]/_}.csv" | cut -c1-200 | head -40
done
