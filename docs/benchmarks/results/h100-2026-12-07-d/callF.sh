# Call F: callE's tree, three more cases end to end at 256 MiB (the budget's last 120 s)
. docs/benchmarks/results/h100-2026-12-07-d/setup.sh
tree() { PYTHONPATH=/tmp/rlk-tree:$EXTRA "$@"; }
tree timeout 110 python3 /tmp/d/e2e.py 256 qwen2.5-0.5b:1024:16,qwen2.5-7b-8l:4096:2,qwen2.5-0.5b:4096:4 > "$OUT/e2e_tree2.txt" 2>&1
