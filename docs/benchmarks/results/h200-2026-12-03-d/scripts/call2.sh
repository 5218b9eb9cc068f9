#!/usr/bin/env bash
# Session 8, call 2: token-level losses in full blocks across sequences: linear GPU tests, the
# block choice and chunk budget in turns (ababpath.py), then the linear-policy-loss bench of
# record with the defaults.
. tools/gpu/common.sh
install_peers_and_rlk
"$PY" -m pip install -q --no-deps --force-reinstall scratch/whl/*.whl || exit 1
say linear tests
(cd packages/rlk-cuda && timeout 120 "$PY" -m pytest -q -p no:cacheprovider -rfE tests/test_gpu_linear_policy_loss.py tests/test_gpu_linear.py > "$OUT/linear-tests.txt" 2>&1; echo "linear tests rc=$?"; tail -3 "$OUT/linear-tests.txt" | cut -c1-300)
say ababpath
timeout 200 "$PY" scratch/gpu/s8/ababpath.py 2>&1 | grep -v -i warn | tee "$OUT/ababpath.txt" | cut -c1-260
say lpl bench
timeout 130 "$PY" benchmarks/profiler.py --workloads linear-policy-loss --backends cuda --peers cublas --dtype bfloat16 --time-limit 110 --output-dir "$OUT/lpl" > "$OUT/lpl.log" 2>&1; echo "bench rc=$?"
grep "rlk:cuda\|cublas" "$OUT/lpl/report.md" | cut -d'|' -f3-8,11 | sed 's/floor, not a peer.*//' | cut -c1-230
say done
