# Call H: issue #29 item 1 on an H200, main's shifted reads beside the staged forward
# (h100-2026-12-07-b/staged_forward.patch): the kernels alone, then the logp-unaligned bench. On
# any other card, only the head's logp-unaligned bench (the rows after the logp split).
set -uo pipefail
put() { [ -d "$1" ] || python3 -m pip install -q --no-index --no-deps --no-compile --target "$@"; }
put /tmp/rlk-head .whl/head/*.whl
put /tmp/rlk-staged .whl/head/rlk_core*.whl .whl/staged/*.whl
export PYTHONUNBUFFERED=1
BENCH=(python3 -c "import sys; from rlk.cli import main; sys.argv[0] = 'rlk-core'; sys.exit(main())" bench)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/device.txt"
t0=$(date +%s); el() { echo "+$(( $(date +%s) - t0 ))s"; }
unaligned() {  # unaligned SITE TAG
  PYTHONPATH=$1 timeout 100 "${BENCH[@]}" --workloads logp-unaligned --backends cuda --peers eager \
    --dtype bfloat16,float16,float32 --time-limit 70 --output-dir "/tmp/bench-$2" > "$OUT/bench_$2.log" 2>&1
  cp "/tmp/bench-$2/report.md" "$OUT/bench_$2.md"; tail -1 "$OUT/bench_$2.log"; el
}
if grep -q H200 "$OUT/device.txt"; then
  for tag in old new; do
    for dt in 1 2 0; do for v in 32001 50257 65537 200001; do timeout 20 scratch/bin/lka_$tag $tag $dt 8192 $v; done; done
    timeout 20 scratch/bin/lka_$tag $tag 1 8192 151665 151936; timeout 20 scratch/bin/lka_$tag $tag 1 12345 50257
    timeout 20 scratch/bin/lka_$tag $tag 1 8192 32768; timeout 20 scratch/bin/lka_$tag $tag 1 8192 151936
  done > "$OUT/kernels.txt" 2>&1; grep "ent=0" "$OUT/kernels.txt" | cut -c1-100; el
  unaligned /tmp/rlk-head head
  unaligned /tmp/rlk-staged staged
else
  unaligned /tmp/rlk-head head
fi
