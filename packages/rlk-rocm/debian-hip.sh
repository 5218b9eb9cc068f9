#!/usr/bin/env bash
# Compile rlk-rocm with Debian's HIP toolchain (no AMD GPU needed) and run its CPU tests.
#
#   bash packages/rlk-rocm/ci-build.sh [PYTHON]
#
# PYTHON (default: python3) is the interpreter whose environment receives the wheel; it must
# already have torch and rlk-core (nox's build-rocm session provides both). Steps:
#   1. hipcc (Debian, ROCm 5.2) through apt-get when it is missing;
#   2. CMake >= 3.27, scikit-build-core and nanobind through pip;
#   3. the sdist, then the wheel built from the unpacked sdist (proves it is self-contained)
#      with HIP_PLATFORM=amd and RLK_ROCM_ARCHITECTURES (default gfx90a;gfx940;gfx1030: wave64
#      and wave32 targets this toolchain has; it cannot build gfx942);
#   4. installs the wheel and runs packages/rlk-rocm/tests with RLK_ROCM_REQUIRE_BUILD=1.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${1:-python3}"
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
    clang="$(HIP_PLATFORM=amd hipconfig --hipclangpath 2>/dev/null || true)"
    version="$(HIP_PLATFORM=amd hipconfig --full 2>/dev/null | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -1)"
    for candidate in "$clang/clang++" "/usr/bin/clang++-$version" /usr/bin/clang++; do
        if [ -x "$candidate" ]; then export HIPCXX="$candidate"; break; fi
    done
    rocm_root="$(HIP_PLATFORM=amd hipconfig --rocmpath 2>/dev/null || echo /usr)"
    bitcode="$(dirname "$(find "$rocm_root/lib" -maxdepth 4 -name 'ockl.bc' 2>/dev/null | head -1)" 2>/dev/null || true)"
    export HIPFLAGS="${HIPFLAGS:---rocm-path=$rocm_root${bitcode:+ --hip-device-lib-path=$bitcode}}"
    export CMAKE_PREFIX_PATH="${CMAKE_PREFIX_PATH:-$rocm_root/lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)/cmake}"
fi
echo "rlk-rocm ci-build: HIPCXX=${HIPCXX:-<cmake default>} HIPFLAGS=${HIPFLAGS:-} targets=$RLK_ROCM_ARCHITECTURES"

"$python" -m pip install -q "cmake>=3.27" ninja "scikit-build-core>=1.1" "nanobind>=2.4" build

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$python" -m build --sdist --no-isolation --outdir "$work/dist" "$here"
sdist="$(ls "$work"/dist/rlk_rocm-*.tar.gz)"
tar -xzf "$sdist" -C "$work"
unpacked="$(ls -d "$work"/rlk_rocm-*/)"
if find "$unpacked" -type l | grep -q .; then
    echo "rlk-rocm ci-build: the sdist still holds symlinks:" >&2
    find "$unpacked" -type l >&2
    exit 1
fi
"$python" -m pip wheel -v --no-build-isolation --no-deps -w "$work/wheels" "$unpacked"
"$python" -m pip install --force-reinstall --no-deps "$work"/wheels/rlk_rocm-*.whl

cd "$work"  # import the installed package, not the source tree
RLK_ROCM_REQUIRE_BUILD=1 "$python" -m pytest -q -p no:cacheprovider "$here/tests"
