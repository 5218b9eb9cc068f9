#!/usr/bin/env bash
# Session 9, call 5: segdebug2.py on the segmented draw's build (scratch/segwhl, withdrawn),
# then the sample and logp GPU tests on the final build (the one-call launch path alone).
. tools/gpu/common.sh
install_peers_and_rlk
"$PY" -m pip install -q --no-deps --target /tmp/segsite scratch/segwhl/*.whl || exit 1
say segdebug2
(cd docs/benchmarks/results/h200-2026-12-03-e/scripts && PYTHONPATH="/tmp/segsite:$PYTHONPATH" timeout 60 "$PY" segdebug2.py 2>&1 | cut -c1-500)
"$PY" -m pip install -q --no-deps --force-reinstall scratch/whl/*.whl || exit 1
say final build tests
(cd packages/rlk-cuda && timeout 100 "$PY" -m pytest -q -p no:cacheprovider -rfE -m gpu tests/test_gpu_sample.py tests/test_gpu_logp_tma.py tests/test_gpu_logp_edges.py tests/test_gpu_logp.py > "$OUT/final-tests.txt" 2>&1; echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/final-tests.txt" | cut -c1-250 | tail -8)
say done
