#!/usr/bin/env bash
# Run a command with Debian's HIP toolchain (ROCm 5.2, clang 15) set up for rlk-rocm's build;
# no AMD GPU needed. The wheels session builds rlk-rocm through it:
#
#   bash packages/rlk-rocm/debian-hip.sh python -m pip wheel packages/rlk-rocm
#
#   1. installs hipcc through apt-get when it is missing (it brings the HIP runtime library the
#      extension links, which the build-rocm session's tests load);
#   2. exports HIP_PLATFORM=amd, HIPCXX, HIPFLAGS and CMAKE_PREFIX_PATH for Debian's layout, and
#      RLK_ROCM_ARCHITECTURES (default gfx90a;gfx940;gfx1030: wave64 and wave32 targets this
#      clang has; it rejects gfx942, which needs LLVM 17, i.e. ROCm >= 5.7);
#   3. runs the command.
set -euo pipefail
export HIP_PLATFORM=amd
export RLK_ROCM_ARCHITECTURES="${RLK_ROCM_ARCHITECTURES:-gfx90a;gfx940;gfx1030}"

if ! command -v hipcc >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q hipcc
    $sudo apt-get clean  # the downloaded .debs: CI machines can be short of disk
fi

# Debian installs ROCm under /usr and its clang as clang++-<N>; CMake needs to be told.
if [ -z "${HIPCXX:-}" ] && [ ! -x /opt/rocm/llvm/bin/clang++ ]; then
    clang="$(hipconfig --hipclangpath 2>/dev/null || true)"
    version="$(hipconfig --full 2>/dev/null | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -1)"
    for candidate in "$clang/clang++" "/usr/bin/clang++-$version" /usr/bin/clang++; do
        if [ -x "$candidate" ]; then export HIPCXX="$candidate"; break; fi
    done
    rocm_root="$(hipconfig --rocmpath 2>/dev/null || echo /usr)"
    bitcode="$(dirname "$(find "$rocm_root/lib" -maxdepth 4 -name 'ockl.bc' 2>/dev/null | head -1)" 2>/dev/null || true)"
    export HIPFLAGS="${HIPFLAGS:---rocm-path=$rocm_root${bitcode:+ --hip-device-lib-path=$bitcode}}"
    export CMAKE_PREFIX_PATH="${CMAKE_PREFIX_PATH:-$rocm_root/lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)/cmake}"
fi
echo "rlk-rocm debian-hip: HIPCXX=${HIPCXX:-<cmake default>} HIPFLAGS=${HIPFLAGS:-} targets=$RLK_ROCM_ARCHITECTURES" >&2
exec "$@"
