"""rlk-rocm registers exactly what rlk-cuda registers: same ops, modules, properties, dtypes.

The kernels and host modules are rlk-cuda's, so a kernel rlk-cuda adds (or drops) must appear
here too; this test fails when the two tables drift. It reads rlk_cuda.plugin (importable
without CUDA) from the monorepo beside this package, or from an installed rlk-cuda.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

from rlk_rocm import plugin

MONOREPO_CUDA_SRC = Path(__file__).resolve().parents[2] / "rlk-cuda" / "src"


def cuda_plugin(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """rlk_cuda.plugin from the monorepo sources when present (the truth), else as installed."""
    if MONOREPO_CUDA_SRC.is_dir():
        for name in [m for m in sys.modules if m == "rlk_cuda" or m.startswith("rlk_cuda.")]:
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.syspath_prepend(str(MONOREPO_CUDA_SRC))
    try:
        return importlib.import_module("rlk_cuda.plugin")
    except ImportError:
        pytest.skip("rlk-cuda is neither beside this package (an sdist) nor installed")


def _renamed(target: str | None) -> str | None:
    return None if target is None else target.replace("rlk_cuda.", "rlk_rocm.", 1)


def test_same_kernels_as_rlk_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = cuda_plugin(monkeypatch)
    assert set(plugin.KERNELS) == set(cuda.KERNELS)
    for op, entry in cuda.KERNELS.items():
        forward, backward, properties, dtypes = entry
        assert plugin.KERNELS[op] == (_renamed(forward), _renamed(backward), properties, dtypes)
    assert plugin.CHECKS == cuda.CHECKS
    assert plugin.PRIORITY == cuda.PRIORITY
