"""Fixture: a fake `flashinfer` injected through sys.modules for one test."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fake_flashinfer import FakeFlashInfer


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeFlashInfer]:
    """A fake flashinfer 0.6.8 visible to `import flashinfer` for one test."""
    stand_in = FakeFlashInfer()
    for name, module in stand_in.modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    yield stand_in
