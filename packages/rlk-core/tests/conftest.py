"""Fixtures of rlk-core's own tests."""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata

import pytest

from rlk import dispatch, plugins


@pytest.fixture
def use_plugins(fresh_rlk: pytest.MonkeyPatch) -> Callable[..., None]:
    """Replace the installed entry points by `name="module[:object]"` pairs (in-test plugins
    live in fake_plugins.py and fake_plugin_*.py beside this file)."""

    def use(**points: str) -> None:
        found = [metadata.EntryPoint(name=name, value=value, group=plugins.ENTRY_POINT_GROUP)
                 for name, value in sorted(points.items())]
        fresh_rlk.setattr(plugins, "_entry_points", lambda: found)
        dispatch.reset()

    return use
