#!/usr/bin/env bash
# Call 1: linear_policy_loss tests + timing + precision; rlk:flashinfer ratio table; small-op host time; sample at the target shape.
. tools/gpu/common.sh
install_peers_and_rlk
"$PY" -m pip install -q --no-deps --force-reinstall scratch/whl/*.whl || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(timeout 200 "$PY" -c "import flashinfer.sampling as m; m.get_sampling_module()" >/tmp/jit.log 2>&1; echo "JIT sampling exit $? +$(( $(date +%s) - start ))s") &
(timeout 200 "$PY" -c "import flashinfer.topk as m; m.get_topk_module()" >/tmp/jit2.log 2>&1; echo "JIT topk exit $? +$(( $(date +%s) - start ))s") &
mkdir -p "$OUT/linear" "$OUT/flashinfer" "$OUT/small"
say linear-tests
(cd packages/rlk-cuda && timeout 110 "$PY" -m pytest -q -p no:cacheprovider -rfE --maxfail=6 tests/test_gpu_linear_policy_loss.py > "$OUT/linear/tests.txt" 2>&1; tail -25 "$OUT/linear/tests.txt" | cut -c1-300)
say linear-diag
for s in time precision; do timeout 80 "$PY" docs/benchmarks/results/h200-2026-12-03-b/scripts/linear_diag.py $s 2>&1 | grep -v "^rlk:" > "$OUT/linear/$s.txt"; tail -32 "$OUT/linear/$s.txt" | cut -c1-150; done
wait
say flashinfer-bench
timeout 150 "$PY" docs/benchmarks/results/h200-2026-12-03-b/scripts/flashinfer_bench.py > "$OUT/flashinfer/bench.txt" 2>&1; echo "rc=$?"; tail -22 "$OUT/flashinfer/bench.txt"
say small-host
timeout 50 "$PY" benchmarks/cuda/small_ops_host_time.py > "$OUT/small/host.txt" 2>&1; echo "rc=$?"; grep -E " host .* ms " "$OUT/small/host.txt" | sed 's/  wall [0-9.]* ms//'
say sample
timeout 40 "$PY" docs/benchmarks/results/h200-2026-12-03-b/scripts/sample_target.py 2>&1 | tail -6
say done
