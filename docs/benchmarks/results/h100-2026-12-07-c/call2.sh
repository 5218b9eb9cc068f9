set -uo pipefail
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> "$OUT/device.txt"
. docs/benchmarks/results/h100-2026-12-07-c/setup.sh
E2E="qwen2.5-0.5b:1024:16,qwen2.5-0.5b:512:16,qwen2.5-1.5b:512:16"
main timeout 260 python3 docs/benchmarks/results/h100-2026-12-07-c/e2e.py 960 $E2E > "$OUT/e2e_main.txt" 2>&1; grep "^{" "$OUT/e2e_main.txt" | cut -c1-140
tree timeout 260 python3 docs/benchmarks/results/h100-2026-12-07-c/e2e.py 960,512,256 $E2E > "$OUT/e2e_tree.txt" 2>&1; grep "^{" "$OUT/e2e_tree.txt" | cut -c1-140
