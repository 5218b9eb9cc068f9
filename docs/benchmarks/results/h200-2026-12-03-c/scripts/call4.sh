#!/usr/bin/env bash
# Session 7, call 4 (last): FlashInfer's JIT in the background while the GPU runs the linear
# tests and the linear-policy-loss bench of record; then, on a quiet host, host times of the
# eager paths, the rlk:flashinfer ratio table, the flashinfer and logp GPU tests, the logp bench.
. tools/gpu/common.sh
install_peers_and_rlk
"$PY" -m pip install -q --no-deps --force-reinstall scratch/whl/*.whl || exit 1
mkdir -p "$OUT/eager" "$OUT/figlue"
(timeout 330 "$PY" -c "import flashinfer.topk as m; m.get_topk_module()" >/tmp/jit1.log 2>&1; echo "JIT topk exit $? +$(( $(date +%s) - start ))s") &
j1=$!
(timeout 330 "$PY" -c "import flashinfer.sampling as s; s.get_sampling_module()" >/tmp/jit2.log 2>&1; echo "JIT sampling exit $? +$(( $(date +%s) - start ))s") &
j2=$!
say linear tests
(cd packages/rlk-cuda && timeout 100 "$PY" -m pytest -q -p no:cacheprovider -rfE tests/test_gpu_linear_policy_loss.py tests/test_gpu_linear.py > "$OUT/linear-tests.txt" 2>&1; echo "linear tests rc=$?"; tail -2 "$OUT/linear-tests.txt" | cut -c1-300)
say abab nseg
timeout 60 "$PY" scratch/gpu/s7/abab.py nseg > "$OUT/abab-nseg.txt" 2>&1; echo "abab rc=$?"; grep "^nseg" "$OUT/abab-nseg.txt" | cut -c1-200
say lpl bench
timeout 110 "$PY" benchmarks/profiler.py --workloads linear-policy-loss --backends cuda --peers cublas --dtype bfloat16 --time-limit 95 --output-dir "$OUT/lpl" > "$OUT/lpl.log" 2>&1; echo "bench rc=$?"
grep "rlk:cuda\|cublas" "$OUT/lpl/report.md" | cut -d'|' -f3-8,11 | sed 's/floor, not a peer.*//' | cut -c1-230
say logp tests
(cd packages/rlk-cuda && timeout 90 "$PY" -m pytest -q -p no:cacheprovider -rfE tests/test_gpu_logp.py tests/test_gpu_logp_edges.py tests/test_gpu_sample.py tests/test_gpu_policy_loss.py > "$OUT/logp-tests.txt" 2>&1; echo "logp tests rc=$?"; tail -2 "$OUT/logp-tests.txt" | cut -c1-300)
wait $j1 $j2
say eager host
timeout 45 "$PY" benchmarks/cuda/logits_ops_host_time.py --profile > "$OUT/eager/host.txt" 2>&1; echo "host rc=$?"
grep -E "(host .* ms|failed:|unavailable)" "$OUT/eager/host.txt" | cut -c1-160
say flashinfer tests
timeout 60 "$PY" -m pytest -q -m gpu packages/rlk-flashinfer/tests -p no:cacheprovider -rfE > "$OUT/figlue/gpu-tests.txt" 2>&1; echo "rc=$?"; tail -3 "$OUT/figlue/gpu-tests.txt" | cut -c1-200
say figlue table
timeout 90 "$PY" scratch/gpu/figlue/bench.py > "$OUT/figlue/bench.txt" 2>&1; echo "rc=$?"
grep -v Warning "$OUT/figlue/bench.txt" | tail -29
say logp bench
timeout 60 "$PY" benchmarks/profiler.py --workloads logp,logp-bwd --backends cuda --peers '' --dtype bfloat16,float16 --time-limit 45 --output-dir "$OUT/logp" --no-summary > "$OUT/logp.log" 2>&1; echo "bench rc=$?"
grep "rlk:cuda " "$OUT/logp/report.md" | cut -d'|' -f2-10 | cut -c1-160
say done
