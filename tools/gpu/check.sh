#!/usr/bin/env bash
# rlk-cuda on the GPU machine: build the extension, run the GPU tests (and the core
# conformance kit on the cuda backend), optionally compute-sanitizer, then the bench's kernel
# workloads on the cuda backend in bfloat16 beside eager and torch.compile (--quick: no peers),
# reports under $OUT/bench (tools/gpu/bench.sh runs the whole suite with every peer).
# Usage (repository root): tools/gpu/check.sh [--sanitize | --quick]   results go to $OUT (or ./bench-results)
set -uo pipefail
OUT="${OUT:-$PWD/bench-results}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export RLK_CUDA_ARCHITECTURES="${RLK_CUDA_ARCHITECTURES:-90a}"
PY="${PYTHON:-python3}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/device.txt"

step() { echo "=== $* ($(date +%T))"; }
step build
"$PY" -m pip install -q --no-build-isolation --no-deps packages/rlk-core 2>&1 | tail -3
"$PY" -m pip install --no-build-isolation --no-deps -v packages/rlk-cuda >"$OUT/build.log" 2>&1 \
  || { tail -40 "$OUT/build.log"; exit 1; }
grep -E "rlk-cuda: building|Linking" "$OUT/build.log"

step gpu tests
(cd packages/rlk-cuda && "$PY" -m pytest -q --maxfail=40 -p no:cacheprovider tests 2>&1 | tee "$OUT/tests.log" | tail -25)
QUICK=""; [[ "${1:-}" == "--quick" ]] && QUICK="--quick"
if [[ -z "$QUICK" ]] && "$PY" -c "import rlk.testing" 2>/dev/null; then
  step conformance kit
  # from an empty folder, so that no repository conftest joins in
  (cd "$(mktemp -d)" && RLK_STRICT_PLUGINS=1 "$PY" -m pytest -q -p no:cacheprovider \
     --pyargs rlk.testing --rlk-backend cuda 2>&1 | tee "$OUT/conformance.log" | tail -15)
fi
step benchmark
PEERS="eager,compile"; [[ -n "$QUICK" ]] && PEERS=""
"$PY" benchmarks/profiler.py --workloads logp,logp-bwd,sample,group-advantages,linear-logp \
  --backends cuda --peers "$PEERS" --dtype bfloat16 --time-limit "${RLK_BENCH_TIME_LIMIT:-300}" \
  --output-dir "$OUT/bench" 2>&1 | tee "$OUT/bench.log" | tail -30
if [[ "${1:-}" == "--sanitize" ]]; then
  cd packages/rlk-cuda
  step compute-sanitizer memcheck
  timeout "${RLK_MEMCHECK_TIMEOUT:-120}" compute-sanitizer --tool memcheck --print-limit 20 \
    "$PY" -m pytest -q -x -p no:cacheprovider tests/test_gpu_logp.py tests/test_gpu_sample.py \
    tests/test_gpu_linear_logp.py -k "not 151936 and not empirical and not invariant and not determinism" \
    2>&1 | tail -8 | tee "$OUT/memcheck.log"
  step compute-sanitizer racecheck
  timeout "${RLK_RACECHECK_TIMEOUT:-90}" compute-sanitizer --tool racecheck --print-limit 20 \
    "$PY" -m pytest -q -x -p no:cacheprovider tests/test_gpu_sample.py -k "float32 or greedy or equal" \
    2>&1 | tail -8 | tee "$OUT/racecheck.log"
  cd ../..
fi
step done
