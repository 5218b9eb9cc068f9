set -uo pipefail
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/device.txt"
. docs/benchmarks/results/h100-2026-12-07-c/setup.sh
{
main timeout 120 python3 docs/benchmarks/results/h100-2026-12-07-c/headbench.py 960 256
SKIP_TRL=1 tree timeout 100 python3 docs/benchmarks/results/h100-2026-12-07-c/headbench.py 960 256 128
} > "$OUT/headbench.txt" 2>&1; grep "^{" "$OUT/headbench.txt" | cut -c1-150
tree timeout 150 python3 -m pytest -n 8 packages/rlk-cuda/tests/test_gpu_linear_logp.py packages/rlk-cuda/tests/test_gpu_linear_policy_loss.py -q -rs -p no:cacheprovider > "$OUT/tests.txt" 2>&1; tail -5 "$OUT/tests.txt"
RLK_INTEGRATIONS=1 tree timeout 170 python3 -m pytest tests/integrations/test_gpu_trl.py -q -s -rs -p no:cacheprovider > "$OUT/trl_parity.txt" 2>&1; tail -8 "$OUT/trl_parity.txt"
