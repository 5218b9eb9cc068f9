#!/usr/bin/env bash
# Session 8, call 5: rlk-cuda's unfiltered draw as an inverse CDF. Sample GPU tests while
# FlashInfer's sampling JIT compiles, then the sample sweep on cuda beside FlashInfer.
. tools/gpu/common.sh
install_peers_and_rlk
"$PY" -m pip install -q --no-deps --force-reinstall scratch/whl/*.whl || exit 1
(timeout 300 "$PY" -c "import flashinfer.sampling as s; s.get_sampling_module()" >/tmp/jit2.log 2>&1; echo "JIT sampling exit $? +$(( $(date +%s) - start ))s") &
j2=$!
say sample tests
(cd packages/rlk-cuda && timeout 150 "$PY" -m pytest -q -p no:cacheprovider -rfE tests/test_gpu_sample.py > "$OUT/sample-tests.txt" 2>&1; echo "sample tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/sample-tests.txt" | cut -c1-250 | tail -12)
wait $j2
say sample sweep
timeout 200 "$PY" benchmarks/profiler.py --workloads sample --backends cuda --peers flashinfer --dtype bfloat16,float32,float16 --time-limit 180 --output-dir "$OUT/sample" --no-summary > /tmp/sample.log 2>&1; tail -1 /tmp/sample.log | cut -c1-200
rm -f "$OUT"/sample/*.png "$OUT"/sample/*.json
grep "^| sample" "$OUT/sample/report.md" | grep "no filter" | grep "rlk:cuda\|| flashinfer" | cut -d'|' -f4-8,10 | sed 's/  */ /g' | cut -c1-100
echo "## findings"; grep "^- .*slower than" "$OUT/sample/report.md" | cut -c1-170 | head -30
say done
