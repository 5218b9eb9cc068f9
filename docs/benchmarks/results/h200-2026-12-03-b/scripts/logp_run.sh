#!/usr/bin/env bash
# logp kernels at the roofline (issue #18 item 1, branch w/logp): the rlk-cuda logp GPU tests and
# SASS test, launch shapes of the real kernels (benchmarks/cuda/logp_shapes.cu), GPU time apart
# from host time through rlk.logp (timing.py), then rlk-core bench for logp and logp-bwd.
# Results in $OUT/logp/. Needs the rlk-cuda wheel built from the merged branch.
source tools/gpu/common.sh
budget=240  # tests 85 s, shapes 10 s, timing 30 s, bench up to 90 s
install_peers_and_rlk
mine="$OUT/logp"; mkdir -p "$mine"
here=docs/benchmarks/results/h200-2026-12-03-b/scripts
"$PY" -c "import rlk_cuda, rlk; print('rlk_cuda', rlk_cuda.__file__)" 2>&1 | tail -1

say "logp/sass tests beside the nvcc build of logp_shapes"
rm -f /tmp/logp_shapes
nvcc_bin="$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)"
if [ -n "$nvcc_bin" ]; then
  ("$nvcc_bin" -O3 -std=c++17 -ftz=true --extended-lambda -arch=sm_90a -I packages/rlk-cuda/csrc \
     -o /tmp/logp_shapes benchmarks/cuda/logp_shapes.cu > "$mine/shapes-build.txt" 2>&1) &
fi
(cd packages/rlk-cuda && timeout 85 "$PY" -m pytest -q -p no:cacheprovider -rfE \
   tests/test_sass.py tests/test_gpu_logp.py tests/test_gpu_logp_edges.py tests/test_gpu_logp_tma.py \
   tests/test_logp_path.py > "$mine/tests.txt" 2>&1; echo "tests rc=$?" >> "$mine/tests.txt")
wait
tail -3 "$mine/tests.txt"; grep -E "^(FAILED|ERROR)" "$mine/tests.txt" | head -5

say "launch shapes (ms/% of copy; full table in shapes.txt)"
if [ -x /tmp/logp_shapes ]; then
  timeout 40 /tmp/logp_shapes > "$mine/shapes.txt" 2>&1
  grep -E "V=(32768|151936)" "$mine/shapes.txt" | sed 's/ GB\/s//'
else
  echo "no nvcc or build failed:"; tail -3 "$mine/shapes-build.txt" 2>/dev/null
fi

say "rlk.logp gpu vs host time"
timeout 45 "$PY" "$here/timing.py" 32768 151936 2>&1 | tee "$mine/timing.txt" | tail -13

limit=$(( $(left) - 25 )); [ "$limit" -gt 90 ] && limit=90; [ "$limit" -lt 20 ] && limit=20
say "bench logp,logp-bwd (time limit ${limit}s)"
timeout $(( limit + 20 )) "$PY" benchmarks/profiler.py --workloads logp,logp-bwd --backends cuda \
  --peers liger --dtype bfloat16,float16,float32 --time-limit "$limit" --output-dir "$mine/bench" \
  --no-summary > "$mine/bench.log" 2>&1; echo "bench rc=$?"
"$PY" "$here/table.py" "$mine/bench/report.json"
say done
