#!/usr/bin/env bash
# Session 9, call 4: debug of the segmented plain draw (segdebug.py).
. tools/gpu/common.sh
install_peers_and_rlk
"$PY" -m pip install -q --no-deps --force-reinstall scratch/whl/*.whl || exit 1
say segdebug
timeout 120 "$PY" docs/benchmarks/results/h200-2026-12-03-e/scripts/segdebug.py 2>&1 | cut -c1-400
say done
