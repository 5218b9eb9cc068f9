# Call E (after 4329051): the tree's rlk_cuda/*.py over main's wheel (/tmp/rlk-tree: a float32
# weight's chunk copies one at a time); its linear and capture GPU tests; end to end at 256 MiB.
# The script as run also held an H200-only branch (the parity test, the unaligned-row timings);
# an H100 came, so only the steps below ran.
. docs/benchmarks/results/h100-2026-12-07-d/setup.sh
rm -rf /tmp/rlk-tree; cp -r /tmp/rlk-old /tmp/rlk-tree; cp packages/rlk-cuda/src/rlk_cuda/*.py /tmp/rlk-tree/rlk_cuda/
tree() { PYTHONPATH=/tmp/rlk-tree:$EXTRA "$@"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/device.txt"
tree timeout 100 python3 -m pytest -n 8 -q -rs -p no:cacheprovider packages/rlk-cuda/tests/test_gpu_linear_logp.py packages/rlk-cuda/tests/test_gpu_capture.py > "$OUT/tree_tests.txt" 2>&1
tree timeout 200 python3 /tmp/d/e2e.py 256 qwen2.5-7b-8l:512:8,qwen2.5-0.5b:512:16,qwen2.5-1.5b:4096:2 > "$OUT/e2e_tree.txt" 2>&1
