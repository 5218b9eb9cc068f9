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
    package, sampling = stand_in.module()
    monkeypatch.setitem(sys.modules, "flashinfer", package)
    monkeypatch.setitem(sys.modules, "flashinfer.sampling", sampling)
    yield stand_in
