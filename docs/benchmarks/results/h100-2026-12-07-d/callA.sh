# Call A: capture + alignment tests and TRL's GPU parity test (main); the bf16-logits backward's
# precision and head timing; the logp kernels alone, main (old) against the staged forward (new)
. docs/benchmarks/results/h100-2026-12-07-d/setup.sh
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv | tee -a "$OUT/device.txt"
main timeout 100 python3 -m pytest -n 8 -q -rs -p no:cacheprovider packages/rlk-cuda/tests/test_gpu_capture.py packages/rlk-cuda/tests/test_gpu_logp_alignment.py > "$OUT/capture_alignment.txt" 2>&1
RLK_INTEGRATIONS=1 main timeout 170 python3 -m pytest tests/integrations/test_gpu_trl.py -q -s -rs -p no:cacheprovider > "$OUT/trl_parity.txt" 2>&1
bf16bwd timeout 90 python3 $D/headprec.py > "$OUT/headprec.txt" 2>&1
SHAPES=2 bf16bwd timeout 80 python3 /tmp/d/headbench.py 256 256g > "$OUT/headbench.txt" 2>&1
for tag in old new; do  # scratch/bin/lka_*: see README
  for dt in 1 2 0; do for v in 32001 50257 65537 200001; do timeout 20 scratch/bin/lka_$tag $tag $dt 8192 $v; done; done
  timeout 20 scratch/bin/lka_$tag $tag 1 8192 151665 151936; timeout 20 scratch/bin/lka_$tag $tag 1 12345 50257
  timeout 20 scratch/bin/lka_$tag $tag 1 8192 32768; timeout 20 scratch/bin/lka_$tag $tag 1 8192 151936
done > "$OUT/kernels.txt" 2>&1
