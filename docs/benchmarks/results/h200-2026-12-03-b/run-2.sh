#!/usr/bin/env bash
# Call 2: logp (w/logp), flashinfer tests + kit, small tests + sweep, linear GEMM/logp diagnostics.
. tools/gpu/common.sh
install_peers_and_rlk
"$PY" -m pip install -q --no-deps --force-reinstall scratch/whl/*.whl || exit 1
mkdir -p "$OUT/linear" "$OUT/flashinfer" "$OUT/small"
RLK_GPU_BUDGET=230 timeout 240 bash docs/benchmarks/results/h200-2026-12-03-b/scripts/logp_run.sh 2>&1 | tail -50
say flashinfer-tests
timeout 90 "$PY" -m pytest -q -x -m gpu packages/rlk-flashinfer/tests -p no:cacheprovider > "$OUT/flashinfer/gpu-tests.txt" 2>&1; echo "rc=$?"; tail -4 "$OUT/flashinfer/gpu-tests.txt"
(cd "$(mktemp -d)" && timeout 70 "$PY" -m pytest -q -x --pyargs rlk.testing --rlk-backend flashinfer -p no:cacheprovider > "$OUT/flashinfer/kit.txt" 2>&1; echo "kit rc=$?"; tail -4 "$OUT/flashinfer/kit.txt")
say small-tests
(cd packages/rlk-cuda && timeout 70 "$PY" -m pytest -q -p no:cacheprovider -rfE tests -k "policy_loss or advantages" > "$OUT/small/tests.txt" 2>&1; echo "rc=$?"; tail -3 "$OUT/small/tests.txt")
timeout 50 "$PY" benchmarks/cuda/group_advantages_sweep.py > "$OUT/small/sweep.txt" 2>&1; grep -E "^ +[0-9]+ +(2|16|4096) |SLOWER|rows" "$OUT/small/sweep.txt" | head -20
say linear-diag2
for s in gemm logp; do timeout 40 "$PY" docs/benchmarks/results/h200-2026-12-03-b/scripts/linear_diag.py $s 2>&1 | grep -v "^rlk:" > "$OUT/linear/$s.txt"; tail -20 "$OUT/linear/$s.txt" | cut -c1-150; done
say done
