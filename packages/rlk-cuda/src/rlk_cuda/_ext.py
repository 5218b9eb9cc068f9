"""Lazy loading of the compiled extension `rlk_cuda._C`.

The extension is imported on first kernel use, so that `import rlk_cuda` and the plugin's
registration work (and can report why) even when the extension cannot load.
"""

from __future__ import annotations

import importlib
from types import ModuleType

_module: ModuleType | None = None
_error: str | None = None


def load() -> ModuleType:
    """The extension module; raises ImportError with the original reason if it cannot load."""
    global _module, _error
    if _module is not None:
        return _module
    if _error is None:
        try:
            _module = importlib.import_module("rlk_cuda._C")
            return _module
        except ImportError as exc:
            _error = f"{type(exc).__name__}: {exc}"
    raise ImportError(f"rlk_cuda extension failed to import: {_error}")


def import_error() -> str | None:
    """None when the extension loads, else the reason it does not."""
    try:
        load()
    except ImportError:
        return _error
    return None


def architectures() -> list[str]:
    """The CUDA architectures the extension was compiled for, e.g. ['80', '90a']."""
    return [a for a in str(load().ARCHITECTURES).split(",") if a]
