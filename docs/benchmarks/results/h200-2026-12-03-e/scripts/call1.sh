#!/usr/bin/env bash
# Session 9, call 1: rlk-cuda's one-call sample path (statistics pass and draw from one
# extension call) and drawn_logp without masking: every rlk-cuda GPU test, the rlk-flashinfer
# GPU tests, the host time of a B=64 call, and the sample sweep on cuda beside FlashInfer.
. tools/gpu/common.sh
install_peers_and_rlk
"$PY" -m pip install -q --no-deps --force-reinstall scratch/whl/*.whl || exit 1
(timeout 300 "$PY" -c "import flashinfer.topk as m; m.get_topk_module()" >/tmp/jit1.log 2>&1; echo "JIT topk exit $? +$(( $(date +%s) - start ))s") &
j1=$!
(timeout 300 "$PY" -c "import flashinfer.sampling as s; s.get_sampling_module()" >/tmp/jit2.log 2>&1; echo "JIT sampling exit $? +$(( $(date +%s) - start ))s") &
j2=$!
say cuda gpu tests
(cd packages/rlk-cuda && timeout 230 "$PY" -m pytest -q -p no:cacheprovider -rfE -m gpu tests > "$OUT/cuda-gpu-tests.txt" 2>&1; echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda-gpu-tests.txt" | cut -c1-250 | tail -15)
wait $j1 $j2
say flashinfer gpu tests
(cd packages/rlk-flashinfer && timeout 120 "$PY" -m pytest -q -m gpu -p no:cacheprovider -rfE tests > "$OUT/flashinfer-tests.txt" 2>&1; echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/flashinfer-tests.txt" | cut -c1-250 | tail -15)
say host
timeout 100 "$PY" docs/benchmarks/results/h200-2026-12-03-e/scripts/cudahost.py > "$OUT/cudahost.txt" 2>&1; head -8 "$OUT/cudahost.txt"
say sample sweep
timeout 150 "$PY" benchmarks/profiler.py --workloads sample --backends cuda --peers flashinfer --dtype bfloat16,float32,float16 --time-limit 130 --output-dir "$OUT/sample" --no-summary > /tmp/sample.log 2>&1; echo "bench rc=$?"; tail -2 /tmp/sample.log | cut -c1-200
rm -f "$OUT"/sample/*.png "$OUT"/sample/*.json
grep "^- .*slower than" "$OUT/sample/report.md" | cut -c1-200
say done
