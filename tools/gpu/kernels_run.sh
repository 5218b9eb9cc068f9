#!/usr/bin/env bash
# One GPU call for issue #29's kernels: install the rlk-cuda wheel built on the CPU machine
# (scratch/whl, carried; else build it here) and the peers (.whl, carried); FlashInfer's sampling JIT in the
# background; every rlk-cuda GPU test (memcheck on the alignment tests beside them); then the
# logp sweeps (aligned and unaligned rows, rlk:cuda only), the sample sweep beside FlashInfer,
# the eager and replayed wall times and the capture warm-ups (benchmarks/cuda/capture.py).
#   RLK_GPU_BUDGET=540 tools/gpu/kernels_run.sh   (results under $OUT)
# Steps to skip: RLK_SKIP="tests sweep sample times warmups" (any of them).
. "$(dirname "$0")/common.sh"
skip() { [[ " ${RLK_SKIP:-} " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader

say "install"
install_peers_and_rlk
if ls scratch/whl/rlk_cuda-*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-deps --force-reinstall scratch/whl/rlk_cuda-*.whl || exit 1
else  # no wheel carried: build here (RLK_CUDA_ARCHITECTURES from common.sh)
  CMAKE_BUILD_PARALLEL_LEVEL=16 "$PY" -m pip install --no-build-isolation --no-deps \
    packages/rlk-cuda >/tmp/build.log 2>&1 || { tail -40 /tmp/build.log; exit 1; }
fi
(timeout 300 "$PY" -c "import flashinfer.sampling as s; s.get_sampling_module()" \
  >/tmp/jit.log 2>&1; echo "flashinfer sampling JIT exit $? at +$(( $(date +%s) - start ))s") &
jit=$!

if ! skip tests; then
  say "rlk-cuda gpu tests"
  (cd packages/rlk-cuda && timeout 100 compute-sanitizer --tool memcheck --error-exitcode 99 \
     "$PY" -m pytest -q -p no:cacheprovider tests/test_gpu_logp_alignment.py \
     -k "1001 or 3001 or 4093" >"$OUT/memcheck.log" 2>&1; echo "memcheck rc=$?" >>"$OUT/memcheck.log") &
  memcheck=$!
  (cd packages/rlk-cuda && timeout 200 "$PY" -m pytest -q -p no:cacheprovider -rfE -m gpu \
     -n 8 tests >"$OUT/cuda-gpu-tests.log" 2>&1; echo "rc=$?")
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda-gpu-tests.log" | cut -c1-200 | tail -25
  wait $memcheck
  tail -3 "$OUT/memcheck.log"
fi

bench() {  # bench NAME SECONDS ARGS...: one sweep into $OUT/NAME, reports without plots
  local name=$1 seconds=$2
  shift 2
  timeout $(( seconds + 20 )) "$PY" benchmarks/profiler.py --time-limit "$seconds" \
    --output-dir "/tmp/$name" --no-summary "$@" >"/tmp/$name.log" 2>&1
  echo "$name rc=$? $(tail -1 "/tmp/$name.log" | cut -c1-150)"
  cp "/tmp/$name/report.md" "$OUT/$name.md" 2>/dev/null

}
if ! skip sweep; then
  say "logp sweeps"
  bench unaligned 75 --workloads logp-unaligned --backends cuda --peers flashinfer
  bench aligned 40 --workloads logp,logp-bwd --backends cuda --peers flashinfer --dtype bfloat16
  cat "$OUT/unaligned.md" "$OUT/aligned.md" | grep -E "^\| logp" | awk -F'|' '{print $3 $4 $5 $6 $8 $10}'
fi
wait $jit
tail -2 /tmp/jit.log
if ! skip sample; then
  say "sample sweep"
  bench sample 80 --workloads sample --backends cuda --peers flashinfer --dtype bfloat16,float32
  grep -E "^- .*slower than" "$OUT/sample.md" | cut -c1-160
fi
if ! skip times; then
  say "replayed wall times"
  timeout 120 "$PY" benchmarks/cuda/capture.py times 2>&1 | tee "$OUT/capture-times.md"
fi
if ! skip warmups; then
  say "capture after each warm-up"
  timeout 150 "$PY" benchmarks/cuda/capture.py warmups 2>&1 | tee "$OUT/capture-warmups.txt"
fi
say "done"
