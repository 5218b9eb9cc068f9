"""Lazy access to what this package's build produced: the compiled extension `<package>._C`
and the build facts `<package>._build` (targets, toolkit version).

rlk-cuda and rlk-rocm install this same module (`__package__` says which one it serves).
The extension is imported on first kernel use, so that importing the package and the
plugin's registration work (and can say why) even when it cannot load; the build facts
are plain Python, readable without loading the GPU runtime.
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
            _module = importlib.import_module(f"{__package__}._C")
            return _module
        except ImportError as exc:
            _error = f"{type(exc).__name__}: {exc}"
    raise ImportError(f"{__package__} extension failed to import: {_error}")


def import_error() -> str | None:
    """None when the extension loads, else the reason it does not."""
    try:
        load()
    except ImportError:
        return _error
    return None


def _build() -> ModuleType | None:
    try:
        return importlib.import_module(f"{__package__}._build")
    except ImportError:
        return None


def built() -> bool:
    """Whether this installation carries the build's output (False in a bare source tree)."""
    return _build() is not None


def architectures() -> list[str]:
    """The targets the extension was compiled for, e.g. ['80', '90a'] or ['gfx90a', 'gfx942']."""
    info = _build()
    return [] if info is None else list(info.ARCHITECTURES)


def toolkit_version() -> str:
    """The CUDA or HIP version the extension was built with ('unknown' if not recorded)."""
    info = _build()
    return "unknown" if info is None else str(info.TOOLKIT_VERSION)
