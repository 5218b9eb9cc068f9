"""The CUDA C++ benchmark programs (benchmarks/cuda/*.cu) still compile against csrc.

They include rlk-cuda's kernel sources and launch the kernels with explicit template
arguments, so a kernel's new parameter breaks them silently: logp_shapes.cu went unbuildable
for a wave that way. Each is compiled to PTX with the device optimizer off, which runs the
whole front end (every template instantiation) in seconds. Needs nvcc; CPU CI runs it in the
build-cuda session.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[1] / "csrc"  # as test_sass.py finds it
PROGRAMS = sorted((Path(__file__).resolve().parents[3] / "benchmarks" / "cuda").glob("*.cu"))
NVCC = shutil.which("nvcc")
FLAGS = ("--ptx", "-std=c++17", "--extended-lambda", "-arch=compute_90a", "-Xcicc", "-O0")

pytestmark = pytest.mark.skipif(NVCC is None, reason="needs nvcc")


def test_the_programs_are_found() -> None:
    assert len(PROGRAMS) >= 3, PROGRAMS


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda path: path.name)
def test_program_compiles(program: Path, tmp_path: Path) -> None:
    built = subprocess.run(
        [str(NVCC), *FLAGS, "-I", str(CSRC), "-o", str(tmp_path / "out.ptx"), str(program)],
        capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-4000:]
