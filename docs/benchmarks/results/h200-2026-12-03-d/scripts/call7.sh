#!/usr/bin/env bash
# Session 8, call 7: where rlk:cuda's sample spends its host time at B=64 (issue 18).
. tools/gpu/common.sh
install_peers_and_rlk
"$PY" -m pip install -q --no-deps --force-reinstall scratch/whl/*.whl || exit 1
say cudahost
timeout 120 "$PY" scratch/gpu/s8/cudahost.py > "$OUT/cudahost.txt" 2>&1; echo "rc=$?"
grep "^torch\." "$OUT/cudahost.txt"; grep -A32 "Ordered by" "$OUT/cudahost.txt" | cut -c1-160
say done
