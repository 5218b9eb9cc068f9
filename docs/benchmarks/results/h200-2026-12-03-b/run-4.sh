#!/usr/bin/env bash
# Call 4: the bench of record for linear-policy-loss (bf16, rlk:cuda, the three-GEMM ceiling).
. tools/gpu/common.sh
install_peers_and_rlk
"$PY" -m pip install -q --no-deps --force-reinstall scratch/whl/*.whl || exit 1
timeout 140 "$PY" benchmarks/profiler.py --workloads linear-policy-loss --backends cuda --peers '' --dtype bfloat16 --time-limit 100 --output-dir "$OUT/lpl" > "$OUT/lpl.log" 2>&1; echo "bench rc=$?"
tail -30 "$OUT/lpl.log" | cut -c1-220
