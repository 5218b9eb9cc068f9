#!/usr/bin/env bash
# Host time of rlk.logp / rlk.sample through the eager path (issue #18, branch w/eager):
# benchmarks/cuda/logits_ops_host_time.py (host and wall ms per call, cProfile of logp fwd+bwd),
# then the rlk-cuda logp GPU tests and rlk-flashinfer's GPU tests. Results in $OUT/eager/.
# Before (round of record): logp fwd+bwd bf16 N=8192 V=32768 host 0.568 ms, wall 0.569 ms
# (GPU 0.46 ms); rlk.sample flashinfer B=64 host 0.30 ms (sampling_from_logits 0.06 ms).
# Success: logp fwd+bwd host well below wall (wall -> GPU time, about 0.46 ms); sample host
# time roughly halved; every test passes. Needs the rlk-cuda wheel of the merge.
source tools/gpu/common.sh
budget=90
install_peers_and_rlk
mine="$OUT/eager"; mkdir -p "$mine"
"$PY" -c "import rlk, rlk_cuda; from rlk.ops.logp import LOGP; print('rlk', rlk.__file__, \
'eager logp:', LOGP.eager is not None)" 2>&1 | tail -1

say "host vs wall ms per call"
timeout 40 "$PY" benchmarks/cuda/logits_ops_host_time.py --profile > "$mine/host.txt" 2>&1
echo "host rc=$?"
grep -E "(host .* ms|failed:|unavailable)" "$mine/host.txt"
grep -A12 "Ordered by" "$mine/host.txt" | grep -E "^ +[0-9]" | head -6 | cut -c1-120

say "rlk-cuda test_gpu_logp.py"
(cd packages/rlk-cuda && timeout 25 "$PY" -m pytest -q -p no:cacheprovider -rfE \
   tests/test_gpu_logp.py > "$mine/tests-logp.txt" 2>&1; echo "rc=$?" >> "$mine/tests-logp.txt")
tail -2 "$mine/tests-logp.txt"; grep -E "^(FAILED|ERROR)" "$mine/tests-logp.txt" | head -4

say "rlk-flashinfer -m gpu"
(cd packages/rlk-flashinfer && timeout $(( $(left) - 3 )) "$PY" -m pytest -q -p no:cacheprovider \
   -rfE -m gpu tests > "$mine/tests-flashinfer.txt" 2>&1; echo "rc=$?" >> "$mine/tests-flashinfer.txt")
tail -2 "$mine/tests-flashinfer.txt"; grep -E "^(FAILED|ERROR)" "$mine/tests-flashinfer.txt" | head -4
say done
