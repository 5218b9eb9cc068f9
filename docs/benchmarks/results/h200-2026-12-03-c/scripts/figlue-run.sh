#!/usr/bin/env bash
# figlue (issue 18): the rlk:flashinfer/FlashInfer ratio table (first: it is the point; the
# first call of each V/dtype/filter compiles the Triton kernels), one call's launches and
# torch ops, then the package's gpu tests. Logs in $OUT/figlue/. Run after FlashInfer's JIT
# (sampling, topk) is warm.
export RLK_GPU_BUDGET="${RLK_GPU_BUDGET:-118}"
source tools/gpu/common.sh
install_peers_and_rlk
mine="$OUT/figlue"; mkdir -p "$mine"
here=scratch/gpu/figlue
cap() { local l; l=$(left); echo $(( l < $1 ? l : $1 )); }
say "ratio table (CUDA events / host issue time per call, ms)"
timeout "$(cap 70)" "$PY" "$here/bench.py" > "$mine/bench.txt" 2>&1; echo "rc=$?"
grep -v Warning "$mine/bench.txt" | tail -27
say "one call's launches and aten ops (B=64 V=128256 bf16)"
timeout "$(cap 15)" "$PY" "$here/bench.py" launches > "$mine/launches.txt" 2>&1; echo "rc=$?"
grep -E "^B=64|aten ops" "$mine/launches.txt" | cut -c1-230
say "gpu tests"
timeout "$(cap 60)" "$PY" -m pytest -q -m gpu packages/rlk-flashinfer/tests -p no:cacheprovider \
  -rfE > "$mine/gpu-tests.txt" 2>&1; echo "rc=$?"; tail -4 "$mine/gpu-tests.txt" | cut -c1-200
say done
