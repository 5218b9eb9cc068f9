set -uo pipefail
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> "$OUT/device.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/rlk-old .whl/old/*.whl  # main's
rm -rf /tmp/rlk-tree; cp -r /tmp/rlk-old /tmp/rlk-tree; cp packages/rlk-cuda/src/rlk_cuda/*.py /tmp/rlk-tree/rlk_cuda/
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/trl-site .whl/trl/*.whl
export PYTHONUNBUFFERED=1 EXTRA=/tmp/trl-site:$PWD/tests/plugins/rlk-testbackend/src
main() { PYTHONPATH=/tmp/rlk-old:$EXTRA "$@"; }
tree() { PYTHONPATH=/tmp/rlk-tree:$EXTRA "$@"; }
E2E="qwen2.5-0.5b:1024:16,qwen2.5-0.5b:512:16,qwen2.5-1.5b:512:16"
main timeout 260 python3 docs/benchmarks/results/h100-2026-12-07-c/e2e.py 960 $E2E > "$OUT/e2e_main.txt" 2>&1; grep "^{" "$OUT/e2e_main.txt" | cut -c1-140
tree timeout 260 python3 docs/benchmarks/results/h100-2026-12-07-c/e2e.py 960,512,256 $E2E > "$OUT/e2e_tree.txt" 2>&1; grep "^{" "$OUT/e2e_tree.txt" | cut -c1-140
