#!/usr/bin/env bash
# One GPU session for everything that needs the device, sized to one 10-minute call:
# build rlk-cuda; in parallel, its GPU tests, the conformance kit on the cuda and flashinfer
# backends and FlashInfer's GPU tests (their JIT compile included); then the benchmark suite
# with every peer in the time left. Needs the peer wheels in .whl/ (carry it).
#   RLK_BENCH_COMMIT=$(git rev-parse HEAD) tools/gpu/full_run.sh
#   RLK_SANITIZE="tests/test_gpu_x.py -k small" tools/gpu/full_run.sh   (also runs those rlk-cuda
#       tests under compute-sanitizer memcheck and racecheck, beside the other checks)
# Writes report.{json,csv,md}, time/memory/roofline.png, checks.log and the test suites' full
# logs under $OUT.
. "$(dirname "$0")/common.sh"

say "install peers and rlk"
install_peers_and_rlk
"$PY" -m pip install --no-build-isolation --no-deps packages/rlk-cuda >/tmp/build.log 2>&1 \
  || { tail -40 /tmp/build.log; exit 1; }

say "checks in parallel"
kit() { (cd "$(mktemp -d)" && "$PY" -m pytest -q -p no:cacheprovider --pyargs rlk.testing \
  --rlk-backend "$1" 2>&1 | tail -12); }
(cd packages/rlk-cuda && timeout 300 "$PY" -m pytest -q -p no:cacheprovider tests 2>&1 \
  | tee "$OUT/cuda-tests-full.log" | tail -12) >/tmp/cuda-tests.log &
(timeout 300 bash -c "$(declare -f kit); PY=$PY; kit cuda") >/tmp/kit-cuda.log &
(timeout 330 "$PY" -m pytest -q -p no:cacheprovider -m gpu packages/rlk-flashinfer/tests 2>&1 \
  | tee "$OUT/flashinfer-tests-full.log" | tail -12; timeout 120 bash -c "$(declare -f kit); PY=$PY; kit flashinfer") \
  >/tmp/flashinfer.log 2>&1 &
logs="cuda-tests kit-cuda flashinfer"
if [ -n "${RLK_SANITIZE:-}" ]; then
  logs="$logs sanitize"
  (cd packages/rlk-cuda && for tool in memcheck racecheck; do
     echo "compute-sanitizer --tool $tool: $RLK_SANITIZE"
     eval "timeout 200 compute-sanitizer --tool $tool --error-exitcode 99 $PY -m pytest -q \
       -p no:cacheprovider $RLK_SANITIZE" 2>&1 | tail -6
   done) >/tmp/sanitize.log 2>&1 &
fi
wait
for log in $logs; do echo "--- $log"; cat "/tmp/$log.log"; done \
  | tee "$OUT/checks.log"

say "benchmark suite, $(( $(left) - 30 ))s"
"$PY" benchmarks/profiler.py --peers eager,compile,liger,cce,flashinfer --time-limit "$(( $(left) - 30 ))" \
  --output-dir "$OUT" "$@" 2>&1 | tail -60
say "done"
