# Sourced by the call scripts, run from the repository root. Wheels built on the CPU machine
# (RLK_CUDA_ARCHITECTURES=90a, Python 3.12) and carried: main's rlk-core and rlk-cuda (.whl/old) in
# /tmp/rlk-old; rlk-cuda with h100-2026-12-07-b/staged_forward.patch (.whl/staged) beside main's
# core in /tmp/rlk-staged; /tmp/rlk-bf16bwd, main's with bf16_backward.patch; TRL 1.16 and its
# wheels (.whl/trl) in /tmp/trl-site; c's e2e.py and headbench.py with *_g_rows.patch in /tmp/d.
set -uo pipefail
D=docs/benchmarks/results/h100-2026-12-07-d
put() { [ -d "$1" ] || python3 -m pip install -q --no-index --no-deps --no-compile --target "$@"; }
put /tmp/rlk-old .whl/old/*.whl
put /tmp/rlk-staged .whl/old/rlk_core*.whl .whl/staged/*.whl
[ -d /tmp/rlk-bf16bwd ] || { cp -r /tmp/rlk-old /tmp/rlk-bf16bwd &&
  patch -s -p4 -d /tmp/rlk-bf16bwd < $D/bf16_backward.patch; }
put /tmp/trl-site .whl/trl/*.whl
mkdir -p /tmp/d && for script in e2e headbench; do
  patch -s -o /tmp/d/$script.py docs/benchmarks/results/h100-2026-12-07-c/$script.py $D/${script}_g_rows.patch
done
export PYTHONUNBUFFERED=1 EXTRA=/tmp/trl-site:$PWD/tests/plugins/rlk-testbackend/src
main() { PYTHONPATH=/tmp/rlk-old:$EXTRA "$@"; }
staged() { PYTHONPATH=/tmp/rlk-staged:$EXTRA "$@"; }
bf16bwd() { PYTHONPATH=/tmp/rlk-bf16bwd:$EXTRA "$@"; }
bench() { python3 -c "import sys; from rlk.cli import main; sys.argv[0] = 'rlk-core'; sys.exit(main())" bench "$@"; }
