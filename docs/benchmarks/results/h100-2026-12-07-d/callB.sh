# Call B: TRL's GRPOTrainer end to end, TRL as is, rlk at 256 MiB, and the same with bf16 logits
# in the backward (row rlk@256g)
. docs/benchmarks/results/h100-2026-12-07-d/setup.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> "$OUT/device.txt"
bf16bwd timeout 560 python3 /tmp/d/e2e.py 256,256g qwen2.5-0.5b:1024:16,qwen2.5-0.5b:512:16,qwen2.5-1.5b:512:16 > "$OUT/e2e.txt" 2>&1
