#!/usr/bin/env bash
# Session 8, call 6: every rlk-cuda GPU test on the final tree.
. tools/gpu/common.sh
install_peers_and_rlk
"$PY" -m pip install -q --no-deps --force-reinstall scratch/whl/*.whl || exit 1
say cuda gpu tests
(cd packages/rlk-cuda && timeout 230 "$PY" -m pytest -q -p no:cacheprovider -rfE -m gpu tests > "$OUT/cuda-gpu-tests.txt" 2>&1; echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda-gpu-tests.txt" | cut -c1-250 | tail -15)
say done
