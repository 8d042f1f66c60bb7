#!/usr/bin/env bash
# The H200's Triton for offline sm_90 compiles (developer tool): installs the version the device ran (its result
# headers name it; 3.6.0 in sweeps/results/h200/header.json) into a cache folder, without dependencies, and prints
# the PYTHONPATH line to compile with it. The device compiles with that version, and its register counts and spills
# differ from this machine's Triton (session 25: the store's KIVI channel walk 210 registers on 3.9, 255 and a
# 184-byte stack on 3.6; the Gluon kivi4 decode loop 961 instructions on 3.9, 1159 on 3.6).
#   eval "$(bash devtools/device_triton.sh)"     # then: python -m devtools.sm90_offline ... / store_sass_offline ...
set -euo pipefail
ver="${1:-$(python3 -c "import json; print(json.load(open('sweeps/results/h200/header.json'))['triton'])")}"
dir="${KVLAB_DEVICE_TRITON:-$HOME/.cache/kvlab/triton-$ver}"
if [ ! -f "$dir/triton/__init__.py" ]; then
  python3 -m pip install -q --no-deps --target "$dir" "triton==$ver" >&2
fi
echo "export PYTHONPATH=$dir TRITON_CACHE_DIR=$dir.cache"
