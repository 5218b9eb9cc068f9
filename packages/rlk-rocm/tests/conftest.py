"""Test set-up: `gpu` tests need a ROCm device; build tests need an installed build.

With RLK_ROCM_REQUIRE_BUILD=1 (set by the build-rocm session) a missing build fails instead of
skipping, so CI cannot pass by testing a source tree.
"""

from __future__ import annotations

import os

import pytest
import torch

from rlk_rocm import _ext


def rocm_device() -> bool:
    return torch.version.hip is not None and torch.cuda.is_available()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a ROCm device and the compiled extension")
    config.addinivalue_line("markers", "build: needs an installed rlk-rocm build")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_gpu = pytest.mark.skip(reason="no ROCm device")
    no_build = pytest.mark.skip(reason="rlk-rocm is not built here (source tree)")
    require_build = os.environ.get("RLK_ROCM_REQUIRE_BUILD") == "1"
    for item in items:
        if "gpu" in item.keywords and not rocm_device():
            item.add_marker(no_gpu)
        if "build" in item.keywords and not _ext.built() and not require_build:
            item.add_marker(no_build)
