#!/usr/bin/env bash
# Download the wheels the bench's `quack` peer needs on the GPU machine into <repo>/.quack/ and
# <repo>/.quack2/ (ignored paths, carried by the device tool), the 88 MB CUDA-13 DSL library
# cut in two so that each call carries less than its 64 MiB with the tree (about 58 and 61 MB
# with the rlk wheels in .whl/rlk).
#
# quack-kernels 0.6.5 declares nvidia-cutlass-dsl>=4.7; its CI image pins 4.7.0. The DSL's
# Python package is in nvidia-cutlass-dsl-libs-core, its kernels' disassembler in
# nvidia-cuda-nvdisasm. The DSL loads the newest CUDA flavour whose libraries are installed
# and the driver supports, so one flavour is enough; einops, protobuf and cuda-bindings are on
# the machine already.
#
# Usage: tools/gpu/quack_wheels.sh   (from anywhere inside the repository; needs PyPI)
# On the GPU machine, two calls in a row (the second while the first machine is still warm).
# A carried folder does not outlive its call, /tmp does. Install under a folder named
# site-packages: QuACK fingerprints every function an epilogue reaches unless its file lies
# in site-packages or dist-packages, and the DSL's own functions reach objects it cannot
# fingerprint (its logger), so its first epilogue fails to compile from a plain --target.
#   call 1, carry .quack:  cp -r .quack /tmp/quack1
#   call 2, carry .quack2 and .whl/rlk:
#     cat /tmp/quack1/cu13.part-* .quack2/cu13.part-* > /tmp/$(cat /tmp/quack1/cu13.name)
#     python3 -m pip install -q --no-index --no-deps --no-compile \
#         --target /tmp/quack/site-packages /tmp/quack1/*.whl .quack2/*.whl \
#         /tmp/$(cat /tmp/quack1/cu13.name)     # every DSL wheel in one pip call
#     export PYTHONPATH=/tmp/quack/site-packages:/tmp/quack/site-packages/nvidia_cutlass_dsl/dsl_packages
#   (docs/benchmarks/results/h100-2026-12-06-b ran it so)
set -euo pipefail

QUACK_VERSION="${QUACK_VERSION:-0.6.5}"
DSL_VERSION="${DSL_VERSION:-4.7.0}"
DLPACK_EXT_VERSION="${DLPACK_EXT_VERSION:-0.1.5}"
TVM_FFI_VERSION="${TVM_FFI_VERSION:-0.1.15.post2}"  # quack: >=0.1.6,<0.2
PYTHON="${PYTHON:-python3}"

root="$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
first="$root/.quack" second="$root/.quack2"
rm -rf "$first" "$second"
mkdir -p "$first" "$second"
for dir in .quack .quack2; do
  grep -qx "/$dir/" "$root/.git/info/exclude" 2>/dev/null || echo "/$dir/" >>"$root/.git/info/exclude"
done

"$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$first" \
  "quack-kernels==${QUACK_VERSION}" "nvidia-cutlass-dsl==${DSL_VERSION}" \
  "nvidia-cutlass-dsl-libs-base==${DSL_VERSION}" "nvidia-cutlass-dsl-libs-cu13==${DSL_VERSION}" \
  "torch-c-dlpack-ext==${DLPACK_EXT_VERSION}"

big="$(cd "$first" && ls nvidia_cutlass_dsl_libs_cu13-*.whl)"
echo "$big" >"$first/cu13.name"
(cd "$first" && split -b 46M "$big" cu13.part- && rm "$big")
mv "$first"/cu13.part-a[b-z] "$second"/
"$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$second" "apache-tvm-ffi==${TVM_FFI_VERSION}" \
  "nvidia-cutlass-dsl-libs-core==${DSL_VERSION}" "nvidia-cuda-nvdisasm>=13.3,<14"
du -sh "$first" "$second"
