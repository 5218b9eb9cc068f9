# Call C: the logp-unaligned bench, main and the staged forward; the 4096-token cases end to end
. docs/benchmarks/results/h100-2026-12-07-d/setup.sh
for build in main staged; do
  $build timeout 140 bench --workloads logp-unaligned --backends cuda --peers eager --dtype bfloat16,float16,float32 --time-limit 100 --output-dir /tmp/bench-$build > "$OUT/bench_$build.log" 2>&1
  cp /tmp/bench-$build/report.md "$OUT/bench_$build.md"
done
bf16bwd timeout 200 python3 /tmp/d/e2e.py 256,256g qwen2.5-0.5b:4096:4,qwen2.5-1.5b:4096:2 > "$OUT/e2e_4096.txt" 2>&1
