# Call D: the 7B shape (8 of 28 layers) end to end at 256 MiB; the linear-logp bench beside cuBLAS
. docs/benchmarks/results/h100-2026-12-07-d/setup.sh
main timeout 200 python3 /tmp/d/e2e.py 256 qwen2.5-7b-8l:512:8,qwen2.5-7b-8l:4096:2 > "$OUT/e2e_7b.txt" 2>&1
main timeout 150 bench --workloads linear-logp --backends cuda --peers cublas --dtype bfloat16 --time-limit 110 --output-dir /tmp/bench-linear > "$OUT/bench_linear.log" 2>&1
cp /tmp/bench-linear/report.md "$OUT/bench_linear.md"
