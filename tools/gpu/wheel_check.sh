#!/usr/bin/env bash
# One rlk-cuda wheel for every torch (issue #28): install the prebuilt wheels into the GPU
# machine's own Python and torch without compiling, then run rlk-cuda's GPU tests and the
# conformance kit from that install, not from the source tree.
#
# Usage (repository root): tools/gpu/wheel_check.sh [WHEEL_DIR]   results go to $OUT
# WHEEL_DIR (default .whl/rlk) holds rlk_core-*.whl and rlk_cuda-*.whl (on Python 3.12+ pip
# takes the cp312-abi3 one). They go to a folder of their own, first on PYTHONPATH, beside the
# machine's packages (torch, pytest, pluggy, numpy); nvcc and hipcc are off PATH throughout.
set -uo pipefail
wheels="$(cd "${1:-.whl/rlk}" && pwd)"
repo="$PWD"
OUT="${OUT:-$repo/bench-results}"
mkdir -p "$OUT"
PY="$(command -v "${PYTHON:-python3}")"
site="$(mktemp -d)"
step() { echo "=== $* ($(date +%T))"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"

# PATH without nvcc and hipcc: one folder linking every other program PATH finds, first wins
# (dropping whole folders would drop /usr/bin, where Debian puts hipcc).
tools="$(mktemp -d)"
IFS=: read -ra dirs <<< "$PATH"
for dir in "${dirs[@]}"; do
  for program in "$dir"/*; do
    name="${program##*/}"
    [[ -x "$program" && ! -d "$program" && ! -e "$tools/$name" && "$name" != nvcc \
       && "$name" != hipcc ]] && ln -s "$program" "$tools/$name"
  done
done
export PATH="$site/bin:$tools" PYTHONPATH="$site" PYTHONUNBUFFERED=1 RLK_STRICT_PLUGINS=1
unset CUDA_HOME CUDA_PATH CUDACXX HIPCXX
if command -v nvcc || command -v hipcc; then echo "a compiler is still on PATH" >&2; exit 1; fi

step install
"$PY" -m pip install --no-index --no-deps --only-binary :all: --find-links "$wheels" \
  --target "$site" rlk-core rlk-cuda 2>&1 | tee "$OUT/install.log" || exit 1
cd "$(mktemp -d)" || exit 1  # nothing of the repository on sys.path from here on
"$PY" - "$site" <<'EOF' 2>&1 | tee -a "$OUT/install.log" || exit 1
import sys, torch, rlk, rlk_cuda
from rlk_cuda import _ext
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)
print("rlk", rlk.__file__, "\nrlk_cuda", rlk_cuda.__file__)
print("extension", _ext.load().__file__, "built for", _ext.architectures())
assert rlk.__file__.startswith(sys.argv[1]) and rlk_cuda.__file__.startswith(sys.argv[1])
EOF
rlk-core doctor 2>&1 | tee "$OUT/doctor.txt" | sed -n '/^Backends/,/^$/p'

# pytest-xdist, where the machine has it, spreads both suites over the CPU cores
workers=()
"$PY" -c "import xdist" 2>/dev/null && workers=(-n "${RLK_TEST_WORKERS:-8}")
step gpu tests
"$PY" -m pytest -q -p no:cacheprovider --maxfail=40 "${workers[@]}" "$repo/packages/rlk-cuda/tests" \
  2>&1 | tee "$OUT/tests.log" | tail -15
step conformance kit
"$PY" -m pytest -q -p no:cacheprovider "${workers[@]}" --pyargs rlk.testing --rlk-backend cuda \
  2>&1 | tee "$OUT/conformance.log" | tail -8
step done
