"""Lazy access to what the build produced: the extension `rlk_rocm._C` and its build facts.

The extension is imported on first kernel use, so that `import rlk_rocm` and the plugin's
registration work (and can report why) even when it cannot load. The build facts
(`rlk_rocm._build`: targets, HIP version) are plain Python, readable without loading HIP.
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
            _module = importlib.import_module("rlk_rocm._C")
            return _module
        except ImportError as exc:
            _error = f"{type(exc).__name__}: {exc}"
    raise ImportError(f"rlk_rocm extension failed to import: {_error}")


def import_error() -> str | None:
    """None when the extension loads, else the reason it does not."""
    try:
        load()
    except ImportError:
        return _error
    return None


def _build() -> ModuleType | None:
    try:
        return importlib.import_module("rlk_rocm._build")
    except ImportError:
        return None


def built() -> bool:
    """Whether this installation carries the build's output (False in a bare source tree)."""
    return _build() is not None


def architectures() -> list[str]:
    """The AMD GPU targets the extension was compiled for, e.g. ['gfx90a', 'gfx942']."""
    info = _build()
    return [] if info is None else list(info.ARCHITECTURES)


def hip_version() -> str:
    """The HIP version the extension was built against, e.g. '6.2.41133' ('unknown' if not)."""
    info = _build()
    return "unknown" if info is None else str(info.HIP_VERSION)
