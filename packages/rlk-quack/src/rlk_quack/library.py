"""Finding QuACK and the CuTe DSL, and their versions, without importing either.

Importing QuACK loads the DSL's compiler (a 180 MB shared library), so the probe reads
distribution metadata; the kernel imports the one epilogue it calls on first use.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from importlib import metadata
from typing import Any

MODULE = "quack"
# distribution -> (lowest supported release, first release beyond), as (major, minor, patch)
SUPPORTED = {
    "quack-kernels": ((0, 6, 5), (0, 7, 0)),
    # 4.8 fails QuACK 0.6.5's first epilogue compile (a ContextVar it cannot fingerprint);
    # QuACK's CI image pins 4.7.0
    "nvidia-cutlass-dsl": ((4, 7, 0), (4, 8, 0)),
}


def installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def release(version: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a version string; None when it does not start with one."""
    match = re.match(r"\s*(\d+)\.(\d+)(?:\.(\d+))?", version)
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def _span(distribution: str) -> str:
    lowest, beyond = SUPPORTED[distribution]
    return f">={'.'.join(map(str, lowest))},<{'.'.join(map(str, beyond))}"


def version_reason(versions: dict[str, str | None]) -> str | None:
    """None when every distribution of SUPPORTED is installed at a supported version, else
    the one-line reason a probe reports. `versions`: distribution -> installed version."""
    for distribution, (lowest, beyond) in SUPPORTED.items():
        version = versions.get(distribution)
        if version is None:
            return (f"{distribution} is not installed (pip install 'rlk-quack[quack]' "
                    "and the DSL's CUDA libraries: docs/backends/quack.md)")
        found = release(version)
        if found is None or not lowest <= found < beyond:
            return (f"{distribution} {version} is outside the supported range "
                    f"{_span(distribution)}")
    return None


def installed_versions() -> dict[str, str | None]:
    return {name: installed_version(name) for name in SUPPORTED}


def load_lse_target() -> Callable[..., dict[str, Any]]:
    """QuACK's GEMM with the LSE and target-logit epilogue, imported on first use."""
    try:
        module = importlib.import_module(f"{MODULE}.epilogue.library")
    except ImportError as exc:
        raise ImportError(
            f"the quack backend needs QuACK: pip install 'rlk-quack[quack]' "
            f"(quack-kernels {_span('quack-kernels')}, nvidia-cutlass-dsl "
            f"{_span('nvidia-cutlass-dsl')})"
        ) from exc
    epilogue: Callable[..., dict[str, Any]] = module.lse_target_epi
    return epilogue
