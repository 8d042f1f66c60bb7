#!/usr/bin/env bash
# The cuDNN frontend's Python wheel (nvidia-cudnn-frontend, ~2 MB, no dependencies it needs for SDPA) for the GPU
# machine, which has no network: the one-call extend (kvlab/kernels/extend/onecall.py) builds its SDPA graph with it.
# Usage, from the project root:   bash benchmarks/cudnn_fe_wheel.sh .carry/cfe   # then carry [".carry/cfe"]
# benchmarks/h200_run.sh's fe_install puts it on PYTHONPATH there (pip --no-index --no-deps --target /tmp/site_cfe).
# The wheel dlopens the libcudnn.so.9 torch's CUDA wheel installed (site-packages/nvidia/cudnn/lib). A user installs
# it with `pip install 'kvlab[cudnn]'`.
set -euo pipefail
dst=${1:?destination folder}; mkdir -p "$dst"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "${PYVER:-3.12}" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux2014_x86_64 \
  -d "$dst" "nvidia-cudnn-frontend==${CFE_VERSION:-1.16.0}"
ls -la "$dst"
