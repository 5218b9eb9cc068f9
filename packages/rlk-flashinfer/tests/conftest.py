"""Fixture: a fake `flashinfer` injected through sys.modules for one test.

Without a CUDA device the backend's Triton kernels run in Triton's interpreter
(TRITON_INTERPRET=1, set before anything imports triton), on CPU tensors.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).parent))

from fake_flashinfer import FakeFlashInfer


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeFlashInfer]:
    """A fake flashinfer 0.6.8 visible to `import flashinfer` for one test."""
    stand_in = FakeFlashInfer()
    for name, module in stand_in.modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    yield stand_in
