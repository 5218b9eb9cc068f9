#!/usr/bin/env bash
# Session 7, call 3: linear GPU tests (scale_rows), rows/budget in turns, the linear benches
# with the cublas floor (FlashInfer's JIT warming meanwhile), then the figlue script.
. tools/gpu/common.sh
install_peers_and_rlk
"$PY" -m pip install -q --no-deps --force-reinstall scratch/whl/*.whl || exit 1
(timeout 200 "$PY" -c "import flashinfer.topk as m, flashinfer.sampling as s; m.get_topk_module(); s.get_sampling_module()" >/tmp/jit.log 2>&1; echo "JIT exit $? +$(( $(date +%s) - start ))s") &
say linear tests
(cd packages/rlk-cuda && timeout 120 "$PY" -m pytest -q -p no:cacheprovider -rfE tests/test_gpu_linear_policy_loss.py tests/test_gpu_linear.py > "$OUT/linear-tests.txt" 2>&1; echo "linear tests rc=$?"; tail -3 "$OUT/linear-tests.txt" | cut -c1-300)
say abab
timeout 90 "$PY" scratch/gpu/s7/abab.py > "$OUT/abab.txt" 2>&1; echo "abab rc=$?"; grep rows "$OUT/abab.txt" | cut -c1-250
say bench
timeout 170 "$PY" benchmarks/profiler.py --workloads linear-policy-loss,linear-logp --backends cuda --peers cublas --dtype bfloat16 --time-limit 150 --output-dir "$OUT/linear" > "$OUT/linear.log" 2>&1; echo "bench rc=$?"
grep "rlk:cuda\|cublas" "$OUT/linear/report.md" | cut -d'|' -f2-8,11 | cut -c1-200
grep -o "[0-9.]*x the cublas floor" "$OUT/linear/report.md"
wait
say figlue
OUT="$OUT" bash scratch/gpu/figlue/run.sh 2>&1 | tail -45
say done
