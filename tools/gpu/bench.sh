#!/usr/bin/env bash
# The benchmark suite on the GPU machine: rlk backends beside every peer, results in $OUT.
#
# Builds nothing. Expects rlk-cuda installed already (tools/gpu/check.sh builds it; or put a
# prebuilt rlk_cuda wheel in .whl/). Installs the pure-Python rlk-core and rlk-flashinfer from
# this tree and every wheel in .whl/ (peers: liger-kernel, cut-cross-entropy, flashinfer-python
# and their missing dependencies) into a private target, then runs `rlk-core bench` through
# benchmarks/profiler.py. Extra arguments go to the bench, e.g.
#   tools/gpu/bench.sh --workloads logp,logp-bwd,logp-entropy
#   RLK_BENCH_COMMIT=<sha> tools/gpu/bench.sh     (records the commit when .git did not travel)
#   RLK_BENCH_TIME_LIMIT=300 tools/gpu/bench.sh   (seconds before no new row starts; default 480)
# Writes report.json, report.csv, report.md, time.png, memory.png, roofline.png and bench.log.
set -uo pipefail
OUT="${OUT:-$PWD/bench-results}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
SITE="${RLK_BENCH_SITE:-/tmp/rlk-bench-site}"

say() { echo "=== $* ($(date +%T))"; }

say "install rlk-core and rlk-flashinfer from the tree"
"$PY" -m pip install -q --no-deps --no-build-isolation packages/rlk-core packages/rlk-flashinfer \
  2>&1 | tail -3
if compgen -G ".whl/*.whl" >/dev/null; then
  say "install wheels from .whl/"
  ls .whl/
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl || exit 1
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi

say "environment"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
"$PY" - <<'PY'
import importlib.metadata as m
for name in ("torch", "triton", "rlk-core", "rlk-cuda", "rlk-flashinfer", "liger-kernel",
             "cut-cross-entropy", "flashinfer-python"):
    try:
        print(f"  {name:18} {m.version(name)}")
    except m.PackageNotFoundError:
        print(f"  {name:18} not installed")
PY
"$PY" -c "import rlk_cuda" 2>/dev/null \
  || echo "warning: rlk_cuda does not import: the cuda rows will be blocked (run tools/gpu/check.sh first)"

say "rlk-core bench"
"$PY" benchmarks/profiler.py --peers eager,compile,liger,cce,flashinfer \
  --time-limit "${RLK_BENCH_TIME_LIMIT:-480}" --output-dir "$OUT" "$@" 2>&1 | tee "$OUT/bench.log"
status=${PIPESTATUS[0]}
say "done (exit $status; 1 means a row failed or ran out of memory: see report.md)"
exit "$status"
