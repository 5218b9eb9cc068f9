# Call G: main's head (f049489: f1ed6c8 and the fixed logp_shapes.cu) on whatever card comes. Everywhere:
# the whole rlk-cuda GPU suite and the conformance kit on the head wheel (the logp split and the
# shared last_error() have not run on a GPU), the TRL parity test, logp_shapes. On an H200 also:
# the unaligned rows, kernels alone (main vs staged) and through the bench.
set -uo pipefail
put() { [ -d "$1" ] || python3 -m pip install -q --no-index --no-deps --no-compile --target "$@"; }
put /tmp/rlk-head .whl/head/*.whl
put /tmp/rlk-staged .whl/head/rlk_core*.whl .whl/staged/*.whl
put /tmp/trl-site .whl/trl/*.whl
export PYTHONUNBUFFERED=1 EXTRA=/tmp/trl-site:$PWD/tests/plugins/rlk-testbackend/src
head_() { PYTHONPATH=/tmp/rlk-head:$EXTRA "$@"; }
staged() { PYTHONPATH=/tmp/rlk-staged:$EXTRA "$@"; }
BENCH=(python3 -c "import sys; from rlk.cli import main; sys.argv[0] = 'rlk-core'; sys.exit(main())" bench)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/device.txt"
t0=$(date +%s); el() { echo "+$(( $(date +%s) - t0 ))s"; }
budget=${BUDGET:-480}; has() { [ $(( $(date +%s) - t0 + $1 )) -lt "$budget" ] || { echo "skipped: needs $1 s"; false; }; }
(cd "$(mktemp -d)" && head_ timeout 150 python3 -m pytest -q -p no:cacheprovider --pyargs rlk.testing --rlk-backend cuda > "$OUT/kit.txt" 2>&1) &
head_ timeout 200 python3 -m pytest -n 8 -q -rfEs -p no:cacheprovider packages/rlk-cuda/tests > "$OUT/cuda_tests.txt" 2>&1
grep -E "^(FAILED|ERROR)" "$OUT/cuda_tests.txt" | cut -c1-160 | head -20; tail -1 "$OUT/cuda_tests.txt"; wait; tail -1 "$OUT/kit.txt"; el
RLK_INTEGRATIONS=1 head_ timeout 120 python3 -m pytest tests/integrations/test_gpu_trl.py -q -s -rs -p no:cacheprovider > "$OUT/trl_parity.txt" 2>&1; tail -1 "$OUT/trl_parity.txt"; el
has 60 && SHAPES=1 head_ timeout 120 python3 docs/benchmarks/results/h100-2026-12-07-c/headbench.py 256 64 32 16 > "$OUT/headbench_small.txt" 2>&1; grep "^{" "$OUT/headbench_small.txt" | cut -c1-150; el
has 40 && timeout 60 scratch/bin/logp_shapes > "$OUT/logp_shapes.txt" 2>&1; echo "logp_shapes rc=$?"; el
if grep -q H200 "$OUT/device.txt"; then
  has 70 && for tag in old new; do
    for dt in 1 2 0; do for v in 32001 50257 65537 200001; do timeout 20 scratch/bin/lka_$tag $tag $dt 8192 $v; done; done
    timeout 20 scratch/bin/lka_$tag $tag 1 8192 151665 151936; timeout 20 scratch/bin/lka_$tag $tag 1 12345 50257
    timeout 20 scratch/bin/lka_$tag $tag 1 8192 32768; timeout 20 scratch/bin/lka_$tag $tag 1 8192 151936
  done > "$OUT/kernels.txt" 2>&1; grep "ent=0" "$OUT/kernels.txt" | cut -c1-100; el
  for build in head_ staged; do
    has 100 || break
    $build timeout 100 "${BENCH[@]}" --workloads logp-unaligned --backends cuda --peers eager --dtype bfloat16,float16,float32 --time-limit 70 --output-dir /tmp/bench-$build > "$OUT/bench_$build.log" 2>&1
    cp /tmp/bench-$build/report.md "$OUT/bench_$build.md"; tail -1 "$OUT/bench_$build.log"; el
  done
elif has 100; then
  head_ timeout 100 "${BENCH[@]}" --workloads logp-unaligned --backends cuda --peers eager --dtype bfloat16,float16,float32 --time-limit 70 --output-dir /tmp/bench-head > "$OUT/bench_head.log" 2>&1
  cp /tmp/bench-head/report.md "$OUT/bench_head.md"; tail -1 "$OUT/bench_head.log"; el
fi
