# Call I (not run: no device time was left): issue #29's baseline on the card at hand. The
# logp-unaligned bench with rlk-cuda as it was before the unaligned-row work (6205ecf, a3a64f3's
# parent) and as it is (f049489), both under the head's rlk-core (the old backend declares plugin
# API 1.1, which the head serves), one after the other on the same machine.
set -uo pipefail
put() { [ -d "$1" ] || python3 -m pip install -q --no-index --no-deps --no-compile --target "$@"; }
put /tmp/rlk-head .whl/head/*.whl
put /tmp/rlk-before .whl/head/rlk_core*.whl .whl/before/*.whl
export PYTHONUNBUFFERED=1
BENCH=(python3 -c "import sys; from rlk.cli import main; sys.argv[0] = 'rlk-core'; sys.exit(main())" bench)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/device.txt"
t0=$(date +%s); el() { echo "+$(( $(date +%s) - t0 ))s"; }
for tag in before head; do
  PYTHONPATH=/tmp/rlk-$tag timeout 70 "${BENCH[@]}" --workloads logp-unaligned --backends cuda --peers eager \
    --dtype bfloat16,float16 --time-limit 50 --output-dir "/tmp/bench-$tag" > "$OUT/bench_$tag.log" 2>&1
  cp "/tmp/bench-$tag/report.md" "$OUT/bench_$tag.md"; tail -1 "$OUT/bench_$tag.log"; el
done
