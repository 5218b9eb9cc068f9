#!/usr/bin/env bash
# Call 3: tests in parallel (linear, logp, flashinfer + kit), then timings (logp bench, linear diag).
. tools/gpu/common.sh
install_peers_and_rlk
"$PY" -m pip install -q --no-deps --force-reinstall scratch/whl/*.whl || exit 1
mkdir -p "$OUT/linear" "$OUT/flashinfer" "$OUT/logp"
(timeout 200 "$PY" -c "import flashinfer.topk as m; m.get_topk_module()" >/tmp/jit2.log 2>&1; echo "JIT topk exit $? +$(( $(date +%s) - start ))s"
 timeout 150 "$PY" -m pytest -q -m gpu packages/rlk-flashinfer/tests -p no:cacheprovider -rfE > "$OUT/flashinfer/gpu-tests.txt" 2>&1; echo "fi tests rc=$?") &
(sleep 100; cd "$(mktemp -d)" && timeout 150 "$PY" -m pytest -q --pyargs rlk.testing --rlk-backend flashinfer -p no:cacheprovider -rfE > "$OUT/flashinfer/kit.txt" 2>&1; echo "fi kit rc=$?") &
say tests
(cd packages/rlk-cuda && timeout 100 "$PY" -m pytest -q -p no:cacheprovider -rfE tests/test_gpu_linear_policy_loss.py tests/test_gpu_linear.py > "$OUT/linear/tests.txt" 2>&1; echo "linear tests rc=$?"; tail -4 "$OUT/linear/tests.txt" | cut -c1-300)
(cd packages/rlk-cuda && timeout 90 "$PY" -m pytest -q -p no:cacheprovider -rfE tests/test_sass.py tests/test_gpu_logp.py tests/test_gpu_logp_edges.py tests/test_gpu_logp_tma.py tests/test_logp_path.py > "$OUT/logp/tests.txt" 2>&1; echo "logp tests rc=$?"; tail -3 "$OUT/logp/tests.txt" | cut -c1-300)
wait
tail -3 "$OUT/flashinfer/gpu-tests.txt" "$OUT/flashinfer/kit.txt" | cut -c1-300
say timings
timeout 70 "$PY" benchmarks/profiler.py --workloads logp,logp-bwd --backends cuda --peers '' --dtype bfloat16,float16 --time-limit 45 --output-dir "$OUT/logp/bench" --no-summary > "$OUT/logp/bench.log" 2>&1; echo "bench rc=$?"
"$PY" docs/benchmarks/results/h200-2026-12-03-b/scripts/table.py "$OUT/logp/bench/report.json" 2>&1 | tail -14
for s in sync time flag; do timeout 60 "$PY" docs/benchmarks/results/h200-2026-12-03-b/scripts/linear_diag.py $s 2>&1 | grep -v "^rlk:" > "$OUT/linear/$s.txt"; grep -v "^ \|^-" "$OUT/linear/$s.txt" | tail -12 | cut -c1-220; done
say done
