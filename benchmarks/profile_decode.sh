#!/usr/bin/env bash
# Nsight Compute on the decode kernel (H200, Firecracker runtime: hardware counters readable with
# --clock-control none; METHOD.md: leave the clocks alone). For each scheme the quick tuner runs
# first in its own process (so ncu does not see its launches) and its config is passed to the
# driver, whose 3rd decode launch is the one profiled.
#   bash benchmarks/profile_decode.sh q4_0 q8_0 fp8_e4m3 bf16 'q4_0@{"orient":"kv","asm":true,"BLOCK_N":128}'
# A scheme may carry config overrides after '@' (JSON merged over the tuned config).
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
# raw counters beside the sections: stall reasons per issued instruction, instructions, smem wavefronts
METRICS="regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,\
l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,\
dram__bytes_read.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"
for arg in "$@"; do
  s="${arg%%@*}"; over="{}"; [ "$arg" != "$s" ] && over="${arg#*@}"
  cfg=$(python3 - "$s" "$over" <<'PY'
import json, sys
from kvlab.kernels.autotune import tune
from kvlab.spec import scheme
shape = {"batch": 32, "heads_q": 32, "heads_kv": 8, "head_dim": 128, "context": 32768,
         "page_size": 32 if scheme(sys.argv[1]).k.axis == "chan" else 16}
over = json.loads(sys.argv[2])
cfg = {**tune("decode", scheme(sys.argv[1]), shape, quick=True, save=False)[0].to_dict(), **over}
if "orient" in over:
    cfg.pop("layout", None)
print(json.dumps(cfg))
PY
)
  tag=$(echo "$arg" | tr -c 'A-Za-z0-9_\n' '_')
  echo "== $s $cfg"
  ncu --clock-control none -k regex:_decode_.*kernel --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \
      --section SchedulerStats --section LaunchStats --metrics "$METRICS" --csv --page details \
      python3 benchmarks/profile_decode.py "$s" --config "$cfg" > "$OUT/ncu_$tag.csv" 2> "$OUT/ncu_$tag.err"
  tail -3 "$OUT/ncu_$tag.err"
  grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Issued Ipc|No Eligible|Shared Memory|stalled|inst_executed|wavefronts|dram__bytes|gmma" \
      "$OUT/ncu_$tag.csv" | awk -F'","' '{v=$NF; gsub(/"/,"",v); print $(NF-2)" | "$(NF-1)" | "v}' | awk -F' [|] ' '$3+0>0.05 || $0 !~ /stalled/' | cut -c1-150 | head -45
done
