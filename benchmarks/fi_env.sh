# Source on the GPU machine (carry .peers_fi, built by ../shared/peers/flashinfer_wheel.sh .peers_fi): unpacks the
# FlashInfer bundle into a temporary site directory and sets what its JIT build needs.
site=$(mktemp -d) && (cd "$site" && python3 -m zipfile -e "$OLDPWD/.peers_fi/flashinfer_pruned.zip" .)
python3 -m pip install -q --no-index --no-deps --target "$site" .peers_fi/apache_tvm_ffi-*.whl
export PYTHONPATH=$site:$PYTHONPATH CUDA_HOME=$(dirname $(dirname $(command -v nvcc))) \
       FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 FLASHINFER_WORKSPACE_BASE=$(mktemp -d)
