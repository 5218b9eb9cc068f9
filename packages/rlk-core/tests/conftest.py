"""Shared fixtures: a dispatcher rebuilt from a controlled environment."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rlk import config, dispatch

RLK_VARIABLES = ("RLK_BACKENDS", "RLK_STRICT", "RLK_PLUGINS", "RLK_DISABLE_PLUGINS",
                 "RLK_STRICT_PLUGINS", "RLK_CHECK_INPUTS", "RLK_TESTBACKEND")


@pytest.fixture
def fresh_rlk(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Clear rlk's environment and dispatcher; the test sets what it needs, then reloads."""
    for name in RLK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    dispatch.reset()
    config.reset_check_inputs()
    yield monkeypatch
    dispatch.reset()
    config.reset_check_inputs()
