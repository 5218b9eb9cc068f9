"""Cross-package tests: plugin discovery through real entry points, the CLI, end to end."""

from __future__ import annotations

import pytest

from rlk import dispatch
from rlk_testbackend import FAILING_PLUGINS


@pytest.fixture
def fresh_rlk(fresh_rlk: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """rlk.testing's clean dispatcher, with the test distribution's failing plugins blocked."""
    fresh_rlk.delenv("RLK_TESTBACKEND", raising=False)
    fresh_rlk.setenv("RLK_DISABLE_PLUGINS", FAILING_PLUGINS)
    dispatch.reset()
    return fresh_rlk
