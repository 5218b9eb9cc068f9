#!/usr/bin/env bash
# Set up and run on a fresh machine, needing only python3 (and pip's registries):
#   bash tools/dev.sh main    the main job: the GRPO example on CPU, then `rlk-core doctor`
#   bash tools/dev.sh test    the test suite (what CI runs first)
#   bash tools/dev.sh -s ...  any nox session(s): lint, docs, build-cuda, build-rocm, vllm, bench
set -euo pipefail
cd "$(dirname "$0")/.."
tools_venv=.venv-tools
if [ ! -x "$tools_venv/bin/nox" ]; then
    python3 -m venv "$tools_venv"
    "$tools_venv/bin/pip" install -q "nox>=2024.4"
fi
case "${1:-}" in
    main) shift; exec "$tools_venv/bin/nox" -s main -- "$@" ;;
    test) shift; exec "$tools_venv/bin/nox" -s tests -- "$@" ;;
    *) exec "$tools_venv/bin/nox" "$@" ;;
esac
