#!/usr/bin/env bash
# Session 7, call 1: host profiles (logp fwd+bwd V=32768, sample B=64), clocks during the
# linear_policy_loss loop vs three cuBLAS GEMMs, the linear GPU tests.
. tools/gpu/common.sh
install_peers_and_rlk
"$PY" -m pip install -q --no-deps --force-reinstall scratch/whl/*.whl || exit 1
mkdir -p "$OUT"
(timeout 200 "$PY" -c "import flashinfer.topk as m; m.get_topk_module()" >/tmp/jit.log 2>&1; echo "JIT topk exit $? +$(( $(date +%s) - start ))s") &
say linear tests
(cd packages/rlk-cuda && timeout 100 "$PY" -m pytest -q -p no:cacheprovider -rfE tests/test_gpu_linear_policy_loss.py tests/test_gpu_linear.py > "$OUT/linear-tests.txt" 2>&1; echo "linear tests rc=$?"; tail -3 "$OUT/linear-tests.txt" | cut -c1-300)
say clocks
timeout 150 "$PY" scratch/gpu/s7/clocks.py profile > "$OUT/clocks.txt" 2>&1; echo "clocks rc=$?"
grep -v "^-\|^ *$" "$OUT/clocks.txt" | head -40 | cut -c1-200
say logp host
timeout 60 "$PY" scratch/gpu/s7/hostprof.py logp > "$OUT/host-logp.txt" 2>&1; echo "rc=$?"; grep "^##" "$OUT/host-logp.txt"
wait
say sample host
timeout 120 "$PY" scratch/gpu/s7/hostprof.py sample > "$OUT/host-sample.txt" 2>&1; echo "rc=$?"; grep "^##" "$OUT/host-sample.txt"
say done
