"""Finding FlashInfer and its version without importing it (importing costs about a second)."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

import rlk.backend

DISTRIBUTION = "flashinfer-python"
MODULE = "flashinfer"
SUPPORTED = "0.6.x-0.7.x"
_LOWEST, _BEYOND = (0, 6), (0, 8)


def installed_version() -> str | None:
    """The distribution's version from its metadata, else an already imported module's."""
    found = rlk.backend.installed_version(DISTRIBUTION)
    if found is not None:
        return found
    version = getattr(sys.modules.get(MODULE), "__version__", None)
    return str(version) if version else None


def is_supported(version: str) -> bool:
    """True for 0.6.x and 0.7.x, the releases whose sampling API this backend was written for."""
    found = rlk.backend.release(version)
    return found is not None and _LOWEST <= found < _BEYOND


def version_reason(version: str | None) -> str | None:
    """None when `version` is supported, else the one-line reason a probe reports."""
    if version is None:
        return f"flashinfer is importable but its version is unknown (no {DISTRIBUTION} metadata)"
    if not is_supported(version):
        return f"{DISTRIBUTION} {version} is outside the supported range {SUPPORTED}"
    return None


def load_topk() -> ModuleType:
    """Import `flashinfer.topk` (radix top-k) on first use, refusing an unsupported version."""
    return _load_submodule("topk")


# name -> (the flashinfer package it was loaded from, the submodule): a call per sample
_LOADED: dict[str, tuple[ModuleType, ModuleType]] = {}


def _load_submodule(name: str) -> ModuleType:
    loaded = _LOADED.get(name)
    if loaded is not None and sys.modules.get(MODULE) is loaded[0]:
        return loaded[1]  # checked when this package was loaded (a test may swap it)
    try:
        package = importlib.import_module(MODULE)
    except ImportError as exc:
        raise ImportError(
            "the flashinfer backend needs FlashInfer: pip install 'rlk-flashinfer[flashinfer]' "
            f"({DISTRIBUTION} {SUPPORTED})"
        ) from exc
    reason = version_reason(getattr(package, "__version__", None) or installed_version())
    if reason is not None:
        raise RuntimeError(reason)
    module = importlib.import_module(f"{MODULE}.{name}")
    _LOADED[name] = (package, module)
    return module
