"""The build refuses to run without nvcc instead of producing a wheel with no extension."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1]
BARE_PATH = "/usr/bin:/bin"


@pytest.mark.skipif(shutil.which("cmake", path=BARE_PATH) is None, reason="needs cmake in /usr/bin")
@pytest.mark.skipif(shutil.which("nvcc", path=BARE_PATH) is not None, reason="nvcc in /usr/bin")
def test_configure_without_nvcc_fails_clearly(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("CUDACXX", "CUDA_PATH", "CUDA_HOME")}
    env["PATH"] = BARE_PATH
    result = subprocess.run(
        [
            "cmake",
            "-S",
            str(PACKAGE),
            "-B",
            str(tmp_path / "build"),
            f"-DPython_EXECUTABLE={sys.executable}",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if "rlk-cuda: no CUDA compiler found" not in result.stderr + result.stdout:
        if result.returncode == 0:
            pytest.skip("CMake found a CUDA compiler outside PATH on this machine")
    assert result.returncode != 0
    assert "rlk-cuda: no CUDA compiler found" in result.stderr
