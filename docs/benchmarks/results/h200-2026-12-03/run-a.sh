#!/usr/bin/env bash
# Verification run: every GPU test and the kit on cuda/flashinfer/native-on-cuda, doctor, small ops.
. tools/gpu/common.sh
budget=570
say "install"
install_peers_and_rlk
"$PY" -m pip install -q --no-deps --force-reinstall scratch/whl/*.whl || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for module in sampling topk; do
  (timeout 300 "$PY" -c "import flashinfer.$module as m; m.get_${module}_module()" \
     >"/tmp/jit-$module.log" 2>&1; echo "JIT $module: exit $? after $(( $(date +%s) - start ))s") &
done
kit() { local name=$1 limit=$2; shift 2; (cd "$(mktemp -d)" && timeout "$limit" "$PY" -m pytest -q \
  -p no:cacheprovider --maxfail=40 -rfE --pyargs rlk.testing "$@" 2>&1) >"/tmp/$name.log"; }
say "rlk-cuda tests + kit cuda + kit tma + native on cuda"
(cd packages/rlk-cuda && timeout 330 "$PY" -m pytest -q -p no:cacheprovider --maxfail=60 -rfE tests 2>&1) >/tmp/cuda-tests.log &
kit kit-cuda 330 --rlk-backend cuda &
RLK_CUDA_LOGP_FORWARD=tma kit kit-tma 300 --rlk-backend cuda -k "logp or entropy" &
kit kit-native-cuda 300 --rlk-backend native --rlk-device cuda -k "distributed or serves" &
wait
say "flashinfer tests + kit, doctor, small ops"
(timeout 150 "$PY" -m pytest -q -p no:cacheprovider -rfE -m gpu packages/rlk-flashinfer/tests 2>&1) >/tmp/flashinfer-tests.log &
kit kit-flashinfer 120 --rlk-backend flashinfer &
{ timeout 60 rlk-core doctor --smoke; echo "doctor exit $?"; timeout 60 "$PY" benchmarks/cuda/small_ops_host_time.py; timeout 60 "$PY" benchmarks/cuda/group_advantages_sweep.py; } >/tmp/small-ops.log 2>&1
wait
for f in cuda-tests kit-cuda kit-tma kit-native-cuda flashinfer-tests kit-flashinfer small-ops; do echo "--- $f"; tail -30 "/tmp/$f.log"; done | tee "$OUT/summary.log"
cat /tmp/cuda-tests.log >"$OUT/cuda-tests.log"; cat /tmp/kit-*.log >"$OUT/kits.log"; cat /tmp/flashinfer-tests.log /tmp/small-ops.log >"$OUT/flashinfer-small.log"
say done
