#!/usr/bin/env bash
# Session 7, call 2: linear GPU tests (upstream scaling kernel), rows per logits GEMM, the
# linear-policy-loss bench with the cublas floor.
. tools/gpu/common.sh
install_peers_and_rlk
"$PY" -m pip install -q --no-deps --force-reinstall scratch/whl/*.whl || exit 1
say linear tests
(cd packages/rlk-cuda && timeout 120 "$PY" -m pytest -q -p no:cacheprovider -rfE tests/test_gpu_linear_policy_loss.py tests/test_gpu_linear.py > "$OUT/linear-tests.txt" 2>&1; echo "linear tests rc=$?"; tail -3 "$OUT/linear-tests.txt" | cut -c1-300)
say rows
timeout 120 "$PY" scratch/gpu/s7/rows.py > "$OUT/rows.txt" 2>&1; echo "rows rc=$?"; tail -5 "$OUT/rows.txt" | cut -c1-400
say clocks
timeout 100 "$PY" scratch/gpu/s7/clocks.py > "$OUT/clocks.txt" 2>&1; echo "clocks rc=$?"; grep -v "^ *first" "$OUT/clocks.txt" | head -20 | cut -c1-200
say bench
timeout 200 "$PY" benchmarks/profiler.py --workloads linear-policy-loss --backends cuda --peers cublas --dtype bfloat16 --time-limit 170 --output-dir "$OUT/lpl" > "$OUT/lpl.log" 2>&1; echo "bench rc=$?"
grep "rlk:cuda\|cublas" "$OUT/lpl/report.md" | cut -c1-260
say done
