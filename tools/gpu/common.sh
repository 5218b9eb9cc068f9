# Shared set-up of the GPU scripts (sourced, not run): settings, timing helpers, and the
# install of the peer wheels in .whl/ and of the pure-Python rlk packages from the tree.
set -uo pipefail
start=$(date +%s)
budget="${RLK_GPU_BUDGET:-540}"
OUT="${OUT:-$PWD/bench-results}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 RLK_STRICT_PLUGINS=1
export RLK_CUDA_ARCHITECTURES="${RLK_CUDA_ARCHITECTURES:-90a}"
PY="${PYTHON:-python3}"
site=/tmp/rlk-site
say() { echo "=== $* (+$(( $(date +%s) - start ))s)"; }
left() { echo $(( budget - ($(date +%s) - start) )); }

install_peers_and_rlk() {
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" .whl/*.whl || exit 1
  export PYTHONPATH="$site"
  "$PY" -m pip install -q --no-build-isolation --no-deps packages/rlk-core packages/rlk-flashinfer
}
