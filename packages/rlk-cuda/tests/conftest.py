"""GPU tests carry the `gpu` marker and skip on machines without a CUDA device."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

# The helpers beside this file (tests_reference) import under any pytest import mode.
sys.path.insert(0, str(Path(__file__).parent))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device and the compiled extension")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
