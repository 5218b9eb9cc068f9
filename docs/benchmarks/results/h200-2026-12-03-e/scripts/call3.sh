#!/usr/bin/env bash
# Session 9, call 3: the segment pick counts each segment's implicit 1 (call 2 found the bias).
# The sample GPU tests while FlashInfer's JIT compiles; the small-batch rows in turns
# (abab.py); then the sweep of record for sample on cuda and flashinfer beside FlashInfer.
. tools/gpu/common.sh
install_peers_and_rlk
"$PY" -m pip install -q --no-deps --force-reinstall scratch/whl/*.whl || exit 1
(timeout 300 "$PY" -c "import flashinfer.topk as m; m.get_topk_module()" >/tmp/jit1.log 2>&1; echo "JIT topk exit $? +$(( $(date +%s) - start ))s") &
j1=$!
(timeout 300 "$PY" -c "import flashinfer.sampling as s; s.get_sampling_module()" >/tmp/jit2.log 2>&1; echo "JIT sampling exit $? +$(( $(date +%s) - start ))s") &
j2=$!
say sample gpu tests
(cd packages/rlk-cuda && timeout 150 "$PY" -m pytest -q -p no:cacheprovider -rfE -m gpu tests/test_gpu_sample.py tests/test_gpu_logp_tma.py tests/test_gpu_logp_edges.py > "$OUT/sample-gpu-tests.txt" 2>&1; echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/sample-gpu-tests.txt" | cut -c1-250 | tail -15)
wait $j1 $j2
say in turns
timeout 150 "$PY" docs/benchmarks/results/h200-2026-12-03-e/scripts/abab.py > "$OUT/abab.txt" 2>&1; echo "rc=$?"; cat "$OUT/abab.txt" | cut -c1-250
say sample sweep
timeout 250 "$PY" benchmarks/profiler.py --workloads sample --backends cuda,flashinfer --peers flashinfer --dtype bfloat16,float32,float16 --time-limit 230 --output-dir "$OUT/sample" --no-summary > /tmp/sample.log 2>&1; echo "bench rc=$?"; tail -2 /tmp/sample.log | cut -c1-200
rm -f "$OUT"/sample/*.png "$OUT"/sample/*.json
grep "^- .*slower than" "$OUT/sample/report.md" | cut -c1-200
say done
