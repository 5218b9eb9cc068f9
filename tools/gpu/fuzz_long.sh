#!/usr/bin/env bash
# The fuzz suite's long run (issue #31 item 5): a random seed per process, many examples, one
# pytest process per fuzz module in parallel, each cut (SIGINT, so pytest still prints its
# summary) after SECONDS; then the examples each op ran, summed, and every failure.
# GPU (default): inputs on cuda:0, the cuda backend first; rlk-cuda must be installed (e.g.
# after tools/gpu/check.sh in the same call). CPU: RLK_FUZZ_DEVICE=cpu RLK_BACKENDS=native.
# Usage (repository root): tools/gpu/fuzz_long.sh [SECONDS [EXAMPLES]]   logs go to $OUT/fuzz
set -uo pipefail
seconds="${1:-240}"
examples="${2:-20000}"
OUT="${OUT:-$PWD/bench-results}"
PY="${PYTHON:-python3}"
logs="$OUT/fuzz"
mkdir -p "$logs"
export PYTHONUNBUFFERED=1 RLK_STRICT_PLUGINS="${RLK_STRICT_PLUGINS:-1}" OMP_NUM_THREADS=1
export RLK_FUZZ_DEVICE="${RLK_FUZZ_DEVICE:-cuda}" RLK_BACKENDS="${RLK_BACKENDS:-cuda}"
export RLK_FUZZ_SEED="${RLK_FUZZ_SEED:-random}" RLK_FUZZ_EXAMPLES="$examples"
if [[ "$RLK_FUZZ_DEVICE" == cuda* ]] && ! "$PY" -c "import rlk_cuda" 2>/dev/null; then
  echo "fuzz_long.sh: rlk-cuda is not installed (run tools/gpu/check.sh first)" >&2
  exit 1
fi
echo "=== fuzz long run: device $RLK_FUZZ_DEVICE, backends $RLK_BACKENDS, ${seconds}s," \
     "$examples examples a test ($(date +%T))"
pids=()
for module in packages/rlk-core/tests/fuzz/test_fuzz_*.py; do
  name=$(basename "$module" .py)
  timeout -s INT -k 60 "$seconds" "$PY" -m pytest "$module" -q -p no:cacheprovider \
    >"$logs/$name.log" 2>&1 &
  pids+=($!)
done
wait "${pids[@]}"
echo "=== seeds and results"
for log in "$logs"/test_fuzz_*.log; do
  seed=$(grep -m1 -o "seed [0-9]*" "$log")
  result=$(grep -E "(passed|failed|xfailed|error|interrupted)" "$log" | tail -1)
  echo "$(basename "$log" .log): $seed: $result"
  grep -E "^(FAILED|ERROR) " "$log"
done
echo "=== examples per op (summed over processes)"
cat "$logs"/test_fuzz_*.log | awk '/^  .* [0-9]+ examples$/ {
  op = $0; sub(/ +[0-9]+ examples$/, "", op); sub(/^ +/, "", op); count[op] += $(NF - 1)}
  END {for (op in count) printf "  %-28s %8d\n", op, count[op]}' | sort
