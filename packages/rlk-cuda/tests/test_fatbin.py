"""The installed extension's fat binary holds what its build recorded (issue 28).

Machine code (SASS) for every target that has it (`80-real`, `120`), PTX for every target that
carries it (`120`, `90-virtual`), nothing else, and every kernel of every source compiled for
every machine-code target: no op loses a path on an architecture the probe accepts (sm_80, the
A100, included; the bulk-copy kernels compile to empty bodies off sm_90a). Read with cuobjdump
(pip install nvidia-cuda-cuobjdump); skips without it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from cuda_tools import tool

from rlk_cuda import _ext, probe

CSRC = Path(__file__).resolve().parents[1] / "csrc"
CUOBJDUMP = tool("cuobjdump")
pytestmark = pytest.mark.skipif(CUOBJDUMP is None,
                                reason="needs cuobjdump (pip install nvidia-cuda-cuobjdump)")


def code_kinds(arch: str) -> tuple[str | None, str | None]:
    """(SASS, PTX) architecture names that a CMake CUDA_ARCHITECTURES entry produces."""
    major, minor, suffix, kind = probe._parse(arch)
    name = f"sm_{major}{minor}{suffix}"
    return (None if kind == "-virtual" else name), (None if kind == "-real" else name)


def _dump(flag: str) -> str:
    library = str(_ext.load().__file__)
    return subprocess.run([str(CUOBJDUMP), flag, library], check=True, capture_output=True,
                          text=True).stdout


@pytest.fixture(scope="module")
def sass() -> dict[str, dict[str, set[str]]]:
    """SASS architecture -> source file -> the kernels compiled from it."""
    found: dict[str, dict[str, set[str]]] = {}
    arch = source = ""
    for line in _dump("-res-usage").splitlines():
        if match := re.match(r"arch = (sm_\w+)", line):
            arch = match.group(1)
        elif match := re.match(r"identifier = .*?([\w.]+\.cu)$", line):
            source = match.group(1)
            found.setdefault(arch, {}).setdefault(source, set())
        elif match := re.match(r"\s*Function (\S+):", line):
            found[arch][source].add(match.group(1))
    return found


def test_machine_code_for_exactly_the_recorded_targets(sass: dict[str, dict[str, set[str]]]
                                                       ) -> None:
    wanted = {name for name, _ in map(code_kinds, _ext.architectures()) if name}
    assert wanted, "the build records no target with machine code"
    assert set(sass) == wanted


def test_ptx_for_exactly_the_recorded_targets() -> None:
    listed = re.findall(r"PTX file\s+\d+: \S+\.(sm_\w+)\.ptx", _dump("-lptx"))
    assert set(listed) == {name for _, name in map(code_kinds, _ext.architectures()) if name}


def test_every_source_and_kernel_is_compiled_for_every_target(
        sass: dict[str, dict[str, set[str]]]) -> None:
    sources = {path.name for path in CSRC.glob("*.cu")}
    kernels = {name for by_source in sass.values() for names in by_source.values()
               for name in names}
    assert len(kernels) >= 50, sorted(kernels)  # the parse found the kernels
    for arch, by_source in sass.items():
        assert set(by_source) == sources, arch
        compiled = {name for names in by_source.values() for name in names}
        assert compiled == kernels, f"{arch} lacks {sorted(kernels - compiled)}"
