"""Fixture: a fake `quack` injected through sys.modules for one test."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fake_quack import FakeQuack


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeQuack]:
    """A fake QuACK visible to `import quack` for one test."""
    stand_in = FakeQuack()
    for name, module in stand_in.modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    yield stand_in
