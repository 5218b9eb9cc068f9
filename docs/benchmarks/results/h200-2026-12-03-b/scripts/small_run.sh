#!/usr/bin/env bash
# Small ops' host time (issue #18 item 3, branch w/small, round 2): the rlk-cuda GPU tests of
# policy_loss (now with forward.with_grad: bit-identical to forward + backward, eager backward
# = the kernel backward) and group_advantages; benchmarks/cuda/small_ops_host_time.py
# (policy_loss fwd+bwd through the eager path, now one kernel call per step + one multiply);
# then benchmarks/cuda/group_advantages_sweep.py, whose id rows now race an eager ids peer
# (torch.unique + index_add). Results in $OUT/small/. Needs the rlk-cuda wheel of the merge.
source tools/gpu/common.sh
budget=150
install_peers_and_rlk
mine="$OUT/small"; mkdir -p "$mine"
"$PY" -c "import rlk_cuda, rlk; print('rlk_cuda', rlk_cuda.__file__, 'rlk', rlk.__file__)" 2>&1 | tail -1
"$PY" -c "from rlk_cuda import policy_loss as p; print('with_grad:', hasattr(p.forward, 'with_grad'))"

say "tests -k 'policy_loss or advantages'"
(cd packages/rlk-cuda && timeout 85 "$PY" -m pytest -q -p no:cacheprovider -rfE tests \
   -k "policy_loss or advantages" > "$mine/tests.txt" 2>&1; echo "tests rc=$?" >> "$mine/tests.txt")
tail -2 "$mine/tests.txt"; grep -E "^(FAILED|ERROR)" "$mine/tests.txt" | head -5

say "host time (target: rlk.policy_loss fwd+bwd <= 0.3 ms; round 1 estimate 0.40-0.45)"
timeout 30 "$PY" benchmarks/cuda/small_ops_host_time.py --profile > "$mine/host.txt" 2>&1
echo "host rc=$?"
grep -E " host .* ms " "$mine/host.txt" | sed 's/  wall [0-9.]* ms//'
grep -B2 -A14 "Ordered by" "$mine/host.txt" | grep -E "^ +[0-9]" | head -5 | cut -c1-110

say "group_advantages sweep (target: every row <= its eager peer; ids rows vs eager ids)"
timeout $(( $(left) - 5 )) "$PY" benchmarks/cuda/group_advantages_sweep.py --reps 100 \
  > "$mine/sweep.txt" 2>&1
echo "sweep rc=$?"
head -1 "$mine/sweep.txt"
grep -E "^ +[0-9]+ +(2|16|4096) " "$mine/sweep.txt"
grep -E "SLOWER|disagrees" "$mine/sweep.txt" | grep -vE "^ +[0-9]+ +(2|16|4096) " | head -3
tail -1 "$mine/sweep.txt"
say done
