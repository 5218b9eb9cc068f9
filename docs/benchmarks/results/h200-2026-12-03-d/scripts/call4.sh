#!/usr/bin/env bash
# Session 8, call 4: the sweep of record for issue 18. logp and logp-bwd in three dtypes beside
# Liger while FlashInfer's JIT compiles; then sample on cuda and flashinfer beside FlashInfer's
# own sampler, in three dtypes; then policy-loss and group-advantages beside eager.
. tools/gpu/common.sh
install_peers_and_rlk
"$PY" -m pip install -q --no-deps --force-reinstall scratch/whl/*.whl || exit 1
(timeout 300 "$PY" -c "import flashinfer.topk as m; m.get_topk_module()" >/tmp/jit1.log 2>&1; echo "JIT topk exit $? +$(( $(date +%s) - start ))s") &
j1=$!
(timeout 300 "$PY" -c "import flashinfer.sampling as s; s.get_sampling_module()" >/tmp/jit2.log 2>&1; echo "JIT sampling exit $? +$(( $(date +%s) - start ))s") &
j2=$!
rows() {  # keep report.md and report.csv (the tool returns a few files); count the rows
  rm -f "$1"/*.png "$1"/*.json
  grep "^| [a-z]" "$1/report.md" | grep -v "^| workload" | wc -l
}
say logp sweep
timeout 180 "$PY" benchmarks/profiler.py --workloads logp,logp-bwd --backends cuda --peers liger --dtype float32,bfloat16,float16 --time-limit 160 --output-dir "$OUT/logp" --no-summary > /tmp/logp.log 2>&1; tail -3 /tmp/logp.log | cut -c1-200; echo "bench rc=$?"
rows "$OUT/logp"
wait $j1 $j2
say sample sweep
timeout 230 "$PY" benchmarks/profiler.py --workloads sample --backends cuda,flashinfer --peers flashinfer --dtype bfloat16,float32,float16 --time-limit 210 --output-dir "$OUT/sample" --no-summary > /tmp/sample.log 2>&1; tail -3 /tmp/sample.log | cut -c1-200; echo "bench rc=$?"
rows "$OUT/sample"
say small ops
timeout 80 "$PY" benchmarks/profiler.py --workloads policy-loss,group-advantages --backends cuda --peers eager --time-limit 60 --output-dir "$OUT/small" --no-summary > /tmp/small.log 2>&1; tail -3 /tmp/small.log | cut -c1-200; echo "bench rc=$?"
rows "$OUT/small"
for d in logp sample small; do echo "## findings $d"; grep "^- .*\(below 80%\|slower than\)" "$OUT/$d/report.md" | cut -c1-160 | head -30; done
say done
