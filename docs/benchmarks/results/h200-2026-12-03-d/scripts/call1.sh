#!/usr/bin/env bash
# Session 8, call 1: FlashInfer's JIT in the background while the GPU runs the linear tests
# and the linear_policy_loss kernel breakdown at both shapes; then the rlk:flashinfer host
# breakdown and the flashinfer GPU tests.
. tools/gpu/common.sh
install_peers_and_rlk
"$PY" -m pip install -q --no-deps --force-reinstall scratch/whl/*.whl || exit 1
say installed
(timeout 300 "$PY" -c "import flashinfer.topk as m; m.get_topk_module()" >/tmp/jit1.log 2>&1; echo "JIT topk exit $? +$(( $(date +%s) - start ))s") &
j1=$!
(timeout 300 "$PY" -c "import flashinfer.sampling as s; s.get_sampling_module()" >/tmp/jit2.log 2>&1; echo "JIT sampling exit $? +$(( $(date +%s) - start ))s") &
j2=$!
say linear tests
(cd packages/rlk-cuda && timeout 120 "$PY" -m pytest -q -p no:cacheprovider -rfE tests/test_gpu_linear_policy_loss.py tests/test_gpu_linear.py > "$OUT/linear-tests.txt" 2>&1; echo "linear tests rc=$?"; tail -4 "$OUT/linear-tests.txt" | cut -c1-300)
say lplprof
timeout 100 "$PY" scratch/gpu/s8/lplprof.py 2>&1 | grep -v Warn | tee "$OUT/lplprof.txt" | cut -c1-200
wait $j1 $j2
say fihost
timeout 120 "$PY" scratch/gpu/s8/fihost.py > "$OUT/fihost.txt" 2>&1; echo "rc=$?"
grep "^V=" "$OUT/fihost.txt"; grep -A30 "Ordered by" "$OUT/fihost.txt" | cut -c1-170 | head -32
say flashinfer tests
timeout 150 "$PY" -m pytest -q -m gpu packages/rlk-flashinfer/tests -p no:cacheprovider -rfE > "$OUT/fi-tests.txt" 2>&1; echo "rc=$?"; tail -4 "$OUT/fi-tests.txt" | cut -c1-300
say done
