"""rlk-rocm runs rlk-cuda's host modules unchanged: the same files, bound to rlk_rocm.

Only `__init__` (the backend's name and version) and `probe` differ per package, plus
rlk-rocm's gfx/topology helpers; everything else under src/rlk_rocm links to rlk-cuda's
file, and no build step rewrites it (the old build copied the modules replacing
`rlk_cuda` by `rlk_rocm`, and a parity test policed the copy).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CUDA = REPO / "packages/rlk-cuda/src/rlk_cuda"
ROCM = REPO / "packages/rlk-rocm/src/rlk_rocm"
PER_PACKAGE = {"__init__.py", "probe.py"}
ROCM_ONLY = {"gfx.py", "topology.py"}


def test_every_shared_module_is_rlk_cudas_file():
    shared = {p.name for p in CUDA.glob("*.py")} - PER_PACKAGE
    for name in sorted(shared):
        assert (ROCM / name).resolve() == (CUDA / name).resolve(), \
            f"src/rlk_rocm/{name} must link to rlk-cuda's {name}"
    own = {p.name for p in ROCM.glob("*.py") if not p.is_symlink()}
    assert own == PER_PACKAGE | ROCM_ONLY


def test_shared_modules_name_no_package():
    for path in sorted(CUDA.glob("*.py")):
        if path.name not in PER_PACKAGE:
            text = path.read_text()
            assert "import rlk_cuda" not in text and "from rlk_cuda" not in text, path.name
            assert '"rlk_cuda.' not in text, f"{path.name} names rlk_cuda's modules"


def test_the_rocm_build_rewrites_nothing():
    cmake = (REPO / "packages/rlk-rocm/CMakeLists.txt").read_text()
    assert "string(REPLACE" not in cmake
    assert not (REPO / "packages/rlk-rocm/tests/test_parity.py").exists()


def test_rlk_rocm_from_source_registers_its_own_modules():
    script = (
        "from rlk.backend import Registry\n"
        "import rlk_rocm._ext as ext, rlk_rocm.logp as logp, rlk_rocm.plugin as plugin\n"
        "registry = Registry(['logp', 'sample'])\n"
        "plugin.rlk_register(registry)\n"
        "print(sorted(registry.backends), registry.kernels['logp'][0].target, logp._ext is ext)\n"
    )
    path = os.pathsep.join([str(ROCM.parent), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": path}, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["['rocm']", "rlk_rocm.logp:forward", "True"]
