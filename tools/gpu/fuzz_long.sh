#!/usr/bin/env bash
# The fuzz suite's long run (issue #31 item 5): every fuzz test not marked xfail in a pytest
# process of its own (a random seed each, many examples), RLK_FUZZ_JOBS (nproc) at a time,
# each cut after its share of SECONDS with SIGINT (pytest still prints its summary); then the
# seeds, every failure, and the examples each op ran, summed.
# GPU (default): inputs on cuda:0, the cuda backend first; rlk-cuda must be installed (e.g.
# after tools/gpu/check.sh in the same call). CPU: RLK_FUZZ_DEVICE=cpu RLK_BACKENDS=native.
# RLK_FUZZ_MODULES narrows the run to some modules (paths, space-separated).
# RLK_FUZZ_COPIES="SUBSTRING=N ..." runs N processes (each its own seed) of every test whose
# id contains SUBSTRING: the slow ops reach the example count in the same wall time.
# Usage (repository root): tools/gpu/fuzz_long.sh [SECONDS [EXAMPLES]]   logs go to $OUT/fuzz
set -uo pipefail
seconds="${1:-240}"
examples="${2:-20000}"
OUT="${OUT:-$PWD/bench-results}"
PY="${PYTHON:-python3}"
logs="$OUT/fuzz"
mkdir -p "$logs"
rm -f "$logs"/test_fuzz_*.log "$logs"/test_fuzz_*.stacks
export PYTHONUNBUFFERED=1 RLK_STRICT_PLUGINS="${RLK_STRICT_PLUGINS:-1}" OMP_NUM_THREADS=1
export RLK_FUZZ_DEVICE="${RLK_FUZZ_DEVICE:-cuda}" RLK_BACKENDS="${RLK_BACKENDS:-cuda}"
export RLK_FUZZ_SEED="${RLK_FUZZ_SEED:-random}" RLK_FUZZ_EXAMPLES="$examples"
if [[ "$RLK_FUZZ_DEVICE" == cuda* ]] && ! "$PY" -c "import rlk_cuda" 2>/dev/null; then
  echo "fuzz_long.sh: rlk-cuda is not installed (run tools/gpu/check.sh first)" >&2
  exit 1
fi
echo "=== fuzz long run: device $RLK_FUZZ_DEVICE, backends $RLK_BACKENDS, ${seconds}s," \
     "$examples examples a test ($(date +%T))"
# shellcheck disable=SC2086  # the module list splits on spaces
mapfile -t nodes < <("$PY" -m pytest --collect-only -q -p no:cacheprovider -m "not xfail" \
  ${RLK_FUZZ_MODULES:-packages/rlk-core/tests/fuzz} 2>/dev/null | grep "::")
for rule in ${RLK_FUZZ_COPIES:-}; do
  pattern="${rule%=*}" copies="${rule##*=}"
  for node in "${nodes[@]}"; do
    if [[ "$node" == *"$pattern"* ]]; then
      for (( copy = 1; copy < copies; copy++ )); do nodes+=("$node"); done
    fi
  done
done
jobs="${RLK_FUZZ_JOBS:-$(nproc)}"
waves=$(( (${#nodes[@]} + jobs - 1) / jobs ))
share=$(( seconds / (waves > 0 ? waves : 1) ))
echo "${#nodes[@]} tests, $jobs at a time, ${share}s each"
export share logs PY
# a process still running 30 s after its SIGINT writes every thread's stack (RLK_FUZZ_STACKS)
# before the KILL at 60 s
printf '%s\n' "${nodes[@]}" | cat -n | xargs -P "$jobs" -L 1 bash -c \
  'echo "$1" >"$logs/test_fuzz_$0.log"
   RLK_FUZZ_STACKS="$(( share + 30 )):$logs/test_fuzz_$0.stacks" \
   timeout -s INT -k 60 "$share" "$PY" -m pytest "$1" -q -p no:cacheprovider \
     >>"$logs/test_fuzz_$0.log" 2>&1
   [[ $? == 137 ]] && echo "KILLED 60 s after its SIGINT" >>"$logs/test_fuzz_$0.log"; true'
echo "=== seeds and results"
for log in "$logs"/test_fuzz_*.log; do
  seed=$(grep -m1 -o "seed [0-9]*" "$log")
  result=$(grep -E "(passed|failed|xfailed|error)" "$log" | tail -1)
  if grep -q "KeyboardInterrupt" "$log"; then  # cut at its budget (a failure says FAILED)
    result="cut after ${share}s, no failure"
  fi
  if grep -q "^KILLED" "$log"; then  # no summary: say so, and where it was
    result="killed, result unknown; its stacks 30 s after the SIGINT:"
  fi
  echo "$(head -1 "$log"): $seed: $result"
  grep -E "^(FAILED|ERROR) " "$log"
  grep -q "^KILLED" "$log" && sed 's/^/    /' "${log%.log}.stacks" | head -40
done
echo "=== examples per op (summed over processes)"
cat "$logs"/test_fuzz_*.log | awk '/^  .* [0-9]+ examples$/ {
  op = $0; sub(/ +[0-9]+ examples$/, "", op); sub(/^ +/, "", op); count[op] += $(NF - 1)}
  END {for (op in count) printf "  %-28s %8d\n", op, count[op]}' | sort
