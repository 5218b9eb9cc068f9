#!/usr/bin/env bash
# Issue 18 (float16 at bfloat16's speed, rlk:flashinfer at FlashInfer's speed) in one GPU call
# of at most 9 minutes. Needs the peer wheels in .whl/ (carry it): flashinfer-python,
# apache-tvm-ffi and liger-kernel (tools/gpu/flashinfer_wheels.sh downloads them).
#   1. installs the wheels, rlk-core and rlk-flashinfer; builds rlk-cuda (sm_90a) while
#      FlashInfer JIT-compiles its sampling and topk modules (~100 s each) in parallel;
#   2. runs, in parallel, rlk-cuda's float16/sampling GPU tests and the SASS check, and
#      rlk-flashinfer's GPU tests;
#   3. the sweep in float16 and bfloat16: sample (random row seeds) on cuda and flashinfer
#      beside FlashInfer's own sampler, then logp and logp-bwd at every V beside Liger (in
#      that order, so that --time-limit cuts the least important rows);
#   4. FlashInfer's stage times (benchmarks/flashinfer/sample_stages.py).
# Writes under $OUT: checks.log (test summaries, stage times), tests.log (full test output),
# bench/report.{json,csv,md} and bench/{time,memory,roofline}.png: eight files.
. "$(dirname "$0")/common.sh"
mkdir -p "$OUT/bench"

say "install peers, rlk-core and rlk-flashinfer"
install_peers_and_rlk

say "build rlk-cuda; FlashInfer's JIT of its sampling and topk modules alongside"
for module in sampling topk; do
  (timeout 300 "$PY" -c "import flashinfer.$module as m; m.get_${module}_module()" \
     >"/tmp/jit-$module.log" 2>&1; echo "JIT $module: exit $? after $(( $(date +%s) - start ))s") &
done
"$PY" -m pip install --no-build-isolation --no-deps packages/rlk-cuda >/tmp/build.log 2>&1 \
  || { tail -40 /tmp/build.log; exit 1; }
say "rlk-cuda built"
wait
tail -3 /tmp/jit-*.log

say "GPU tests in parallel"
(cd packages/rlk-cuda && timeout 200 "$PY" -m pytest -q -p no:cacheprovider \
   tests/test_sass.py tests/test_gpu_sample.py tests/test_gpu_logp.py 2>&1) \
  >/tmp/cuda-tests.log &
(timeout 200 "$PY" -m pytest -q -p no:cacheprovider -m gpu packages/rlk-flashinfer/tests 2>&1) \
  >/tmp/flashinfer-tests.log &
wait
{ for log in cuda-tests flashinfer-tests; do echo "--- $log"; tail -15 "/tmp/$log.log"; done; } \
  | tee "$OUT/checks.log"
cat /tmp/cuda-tests.log /tmp/flashinfer-tests.log >"$OUT/tests.log"

stages=60
say "sweep, $(( $(left) - stages ))s"
"$PY" benchmarks/profiler.py --workloads sample,logp,logp-bwd --backends cuda,flashinfer \
  --peers liger,flashinfer --dtype float16,bfloat16 --time-limit "$(( $(left) - stages ))" \
  --output-dir "$OUT/bench" --no-summary 2>&1 | tail -5
"$PY" - "$OUT/bench/report.json" <<'PY' | tee -a "$OUT/checks.log"
import json, sys
report = json.load(open(sys.argv[1]))
print(f"--- sweep: {report['counts']}; copy {report['ceilings']['copy_gbps']:.0f} GB/s")
for row in report["rows"]:
    if row["status"] == "pass":
        pct = row["roofline_pct"]
        print(f"{row['workload']:9s} {row['case']:38s} {row['dtype']:9s} {row['impl']:13s} "
              f"{row['time_ms']:8.3f} ms {pct:5.0f}%")
    elif row["status"] != "blocked":  # blocked: not run in time, or no such kernel
        print(f"{row['workload']:9s} {row['case']:38s} {row['dtype']:9s} {row['impl']:13s} "
              f"{row['status']}: {row['reason'][:120]}")
print(f"--- findings: {len(report['findings'])}")
print("\n".join(report["findings"]))
PY

say "FlashInfer stage times"
timeout "$(( $(left) > 10 ? $(left) : 10 ))" "$PY" benchmarks/flashinfer/sample_stages.py 2>&1 \
  | tee -a "$OUT/checks.log" | tail -12
say "done"
