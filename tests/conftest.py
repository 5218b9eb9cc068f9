"""Cross-package tests: plugin discovery through real entry points, the CLI, end to end."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rlk import config, dispatch
from rlk_testbackend import FAILING_PLUGINS

RLK_VARIABLES = ("RLK_BACKENDS", "RLK_STRICT", "RLK_PLUGINS", "RLK_DISABLE_PLUGINS",
                 "RLK_STRICT_PLUGINS", "RLK_CHECK_INPUTS", "RLK_TESTBACKEND")


@pytest.fixture
def fresh_rlk(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """A dispatcher rebuilt from a clean environment with the failing test plugins blocked."""
    for name in RLK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RLK_DISABLE_PLUGINS", FAILING_PLUGINS)
    dispatch.reset()
    config.reset_check_inputs()
    yield monkeypatch
    dispatch.reset()
    config.reset_check_inputs()
