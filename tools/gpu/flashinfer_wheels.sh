#!/usr/bin/env bash
# Download the wheels the GPU machine needs for rlk-flashinfer's gpu tests, and the Liger peer
# of the benchmark (pure Python over triton, which the machine has), into <repo>/.whl/.
#
# The GPU machine has no network; it already holds torch 2.11 (Python 3.12) and every other
# runtime requirement of flashinfer-python 0.6.8 that `import flashinfer` and its sampling
# module use (click, einops, ninja, numpy, nvidia-ml-py, packaging, requests, tabulate, tqdm,
# typing-extensions). What it lacks: flashinfer-python itself and apache-tvm-ffi (its FFI
# layer, a compiled cp312 wheel). cuda-tile, nvidia-cudnn-frontend and nvidia-cutlass-dsl are
# declared requirements too, but they are imported only by the attention/GEMM/MoE paths, not
# by `import flashinfer` or flashinfer.sampling, so they are not carried.
#
# Usage: tools/gpu/flashinfer_wheels.sh   (from anywhere inside the repository; needs PyPI)
# On the GPU machine:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#       --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
set -euo pipefail

FLASHINFER_VERSION="${FLASHINFER_VERSION:-0.6.8}"
TVM_FFI_VERSION="${TVM_FFI_VERSION:-0.1.15.post2}"
LIGER_VERSION="${LIGER_VERSION:-0.8.5}"
PYTHON="${PYTHON:-python3}"

root="$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
dest="$root/.whl"
mkdir -p "$dest"

# Keep exactly one version of each: two versions of one package stop the whole install there.
rm -f "$dest"/flashinfer_python-*.whl "$dest"/apache_tvm_ffi-*.whl "$dest"/liger_kernel-*.whl

platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 \
         manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done

"$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" -d "$dest" \
  "flashinfer-python==${FLASHINFER_VERSION}" "apache-tvm-ffi==${TVM_FFI_VERSION}" \
  "liger-kernel==${LIGER_VERSION}"

ls -l "$dest"
