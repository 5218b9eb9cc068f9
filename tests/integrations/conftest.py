"""Tests of rlk's framework adapters against the real frameworks.

The `integrations` nox session installs TRL and verl and sets RLK_INTEGRATIONS=1, under
which a missing framework is an error; elsewhere these tests skip without it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpo_trl.py"


def require(module: str) -> ModuleType:
    """Import a framework module; skip without it unless RLK_INTEGRATIONS=1."""
    if os.environ.get("RLK_INTEGRATIONS") == "1":
        return importlib.import_module(module)
    return pytest.importorskip(module)


def example() -> ModuleType:
    """examples/grpo_trl.py as a module: its tiny Qwen2 and tokenizer serve the tests."""
    spec = importlib.util.spec_from_file_location("grpo_trl_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
