#!/usr/bin/env bash
# Set up and run on a fresh machine, needing only python3 (and pip's registries).
set -euo pipefail
usage() {
    cat <<'USAGE'
usage: bash tools/dev.sh COMMAND [ARGS...]

  main             the main job: the GRPO example on CPU (it must learn), then `rlk-core doctor`
  test             the test suite, as CI runs it first (pytest arguments may follow)
  -s SESSION...    other nox sessions of noxfile.py, e.g. lint, docs, wheels, build-cuda,
                   build-rocm, bench, vllm (nox arguments may follow)
  -l, --list       list the nox sessions
  -h, --help       this help

Each command builds its own virtual environment (under .nox/) on first use.
USAGE
}
case "${1:-}" in
    -h|--help) usage; exit 0 ;;
    main|test|-s|--session|--sessions|-l|--list) ;;
    "") usage >&2; exit 2 ;;
    *) echo "tools/dev.sh: unknown command '$1'" >&2; usage >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
tools_venv=.venv-tools
if [ ! -x "$tools_venv/bin/nox" ]; then
    python3 -m venv "$tools_venv"
    "$tools_venv/bin/pip" install -q "nox>=2024.4"
fi
case "$1" in
    main) shift; exec "$tools_venv/bin/nox" -s main -- "$@" ;;
    test) shift; exec "$tools_venv/bin/nox" -s tests -- "$@" ;;
    *) exec "$tools_venv/bin/nox" "$@" ;;
esac
