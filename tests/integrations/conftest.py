"""Tests of rlk's framework adapters against the real frameworks.

The `integrations` nox session installs TRL and verl and sets RLK_INTEGRATIONS=1, under
which a missing framework is an error; elsewhere these tests skip without it.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def require(module: str) -> ModuleType:
    """Import a framework module; skip without it unless RLK_INTEGRATIONS=1."""
    if os.environ.get("RLK_INTEGRATIONS") == "1":
        return importlib.import_module(module)
    return pytest.importorskip(module)
