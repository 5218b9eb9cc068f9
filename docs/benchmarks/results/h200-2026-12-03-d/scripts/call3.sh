#!/usr/bin/env bash
# Session 8, call 3: with the 960 MiB default and token-level blocks across sequences: linear GPU
# tests, the linear benches of record with the cublas floor, then the settings in turns again.
. tools/gpu/common.sh
install_peers_and_rlk
"$PY" -m pip install -q --no-deps --force-reinstall scratch/whl/*.whl || exit 1
say linear tests
(cd packages/rlk-cuda && timeout 120 "$PY" -m pytest -q -p no:cacheprovider -rfE tests/test_gpu_linear_policy_loss.py tests/test_gpu_linear.py tests/test_gpu_linear_parallel.py > "$OUT/linear-tests.txt" 2>&1; echo "linear tests rc=$?"; tail -3 "$OUT/linear-tests.txt" | cut -c1-300)
say linear benches
timeout 200 "$PY" benchmarks/profiler.py --workloads linear-policy-loss,linear-logp --backends cuda --peers cublas --dtype bfloat16 --time-limit 180 --output-dir "$OUT/linear" > "$OUT/linear.log" 2>&1; echo "bench rc=$?"
grep "rlk:cuda\|cublas" "$OUT/linear/report.md" | cut -d'|' -f2-8,11 | sed 's/floor, not a peer.*//' | cut -c1-200
grep -o "[0-9.]*x the cublas floor" "$OUT/linear/report.md" | tr '\n' ' '; echo
say ababpath
timeout 150 "$PY" scratch/gpu/s8/ababpath.py tok768,tok960 2>&1 | grep -v -i warn | tee "$OUT/ababpath.txt" | cut -c1-260
say done
