#!/usr/bin/env bash
# Verification run B: the fixes of the H200 failures, the TRL/verl token_kl GPU test, a logp check.
. tools/gpu/common.sh
budget=280
install_peers_and_rlk
"$PY" -m pip install -q --no-deps --force-reinstall scratch/whl/*.whl || exit 1
(timeout 200 "$PY" -c "import flashinfer.sampling as m; m.get_sampling_module()" >/tmp/jit.log 2>&1; echo "JIT sampling exit $?") &
(timeout 200 "$PY" -c "import flashinfer.topk as m; m.get_topk_module()" >/tmp/jit2.log 2>&1; echo "JIT topk exit $?") &
(cd packages/rlk-cuda && timeout 150 "$PY" -m pytest -q -p no:cacheprovider -rfE tests/test_sass.py tests/test_gpu_logp_edges.py tests/test_gpu_advantages.py tests/test_gpu_token_kl.py "tests/test_gpu_policy_loss.py::test_large_batch" 2>&1 | tail -8) >/tmp/t1.log &
(cd "$(mktemp -d)" && timeout 150 "$PY" -m pytest -q -p no:cacheprovider -rfE --pyargs rlk.testing --rlk-backend cuda -k "tiny or entropy" 2>&1 | tail -6) >/tmp/t2.log &
(cd "$(mktemp -d)" && RLK_CUDA_LOGP_FORWARD=tma timeout 150 "$PY" -m pytest -q -p no:cacheprovider -rfE --pyargs rlk.testing --rlk-backend cuda -k "tiny" 2>&1 | tail -4) >/tmp/t3.log &
wait
"$PY" benchmarks/profiler.py --workloads logp --backends cuda --peers '' --dtype bfloat16,float16 --time-limit 25 --output-dir /tmp/lb --no-summary >/tmp/lb.log 2>&1
(cd "$(mktemp -d)" && timeout 60 "$PY" -m pytest -q -p no:cacheprovider -rfE --pyargs rlk.testing --rlk-backend flashinfer 2>&1 | tail -6) >/tmp/t4.log
for f in t1 t2 t3 t4; do echo "--- $f"; cat /tmp/$f.log; done
"$PY" -c "
import json; r=json.load(open('/tmp/lb/report.json'))
for x in r['rows']:
  print(x['case'][:30].ljust(30), x['dtype'], x['impl'], x['status'], round(x.get('time_ms') or -1,3), round(x.get('roofline_pct') or -1))"
say done
