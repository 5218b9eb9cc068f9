#!/usr/bin/env bash
# Session 9, call 2: the plain draw reads only the segment that holds it (after a split
# statistics pass). Every rlk-cuda GPU test while FlashInfer's JIT compiles, then the sweep
# of record for sample on cuda and flashinfer beside FlashInfer's own sampler, three dtypes.
. tools/gpu/common.sh
install_peers_and_rlk
"$PY" -m pip install -q --no-deps --force-reinstall scratch/whl/*.whl || exit 1
(timeout 300 "$PY" -c "import flashinfer.topk as m; m.get_topk_module()" >/tmp/jit1.log 2>&1; echo "JIT topk exit $? +$(( $(date +%s) - start ))s") &
j1=$!
(timeout 300 "$PY" -c "import flashinfer.sampling as s; s.get_sampling_module()" >/tmp/jit2.log 2>&1; echo "JIT sampling exit $? +$(( $(date +%s) - start ))s") &
j2=$!
say cuda gpu tests
(cd packages/rlk-cuda && timeout 230 "$PY" -m pytest -q -p no:cacheprovider -rfE -m gpu tests > "$OUT/cuda-gpu-tests.txt" 2>&1; echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda-gpu-tests.txt" | cut -c1-250 | tail -15)
grep -E "inverse_cdf|never_drawn|beyond_the_groups" "$OUT/cuda-gpu-tests.txt" | head -5
wait $j1 $j2
say sample sweep
timeout 250 "$PY" benchmarks/profiler.py --workloads sample --backends cuda,flashinfer --peers flashinfer --dtype bfloat16,float32,float16 --time-limit 230 --output-dir "$OUT/sample" --no-summary > /tmp/sample.log 2>&1; echo "bench rc=$?"; tail -2 /tmp/sample.log | cut -c1-200
rm -f "$OUT"/sample/*.png "$OUT"/sample/*.json
grep "^- .*slower than" "$OUT/sample/report.md" | cut -c1-200
say done
