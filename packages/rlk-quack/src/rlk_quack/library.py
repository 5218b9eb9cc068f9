"""Finding QuACK and the CuTe DSL, and their versions, without importing either.

Importing QuACK loads the DSL's compiler (a 180 MB shared library), so the probe reads
distribution metadata; the kernel imports the one epilogue it calls on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from rlk.backend import installed_version, release, version_range

MODULE = "quack"
# distribution -> (lowest supported release, first release beyond), as (major, minor, patch)
SUPPORTED = {
    "quack-kernels": ((0, 6, 5), (0, 7, 0)),
    # 4.8 fails QuACK 0.6.5's first epilogue compile (a ContextVar it cannot fingerprint);
    # QuACK's CI image pins 4.7.0
    "nvidia-cutlass-dsl": ((4, 7, 0), (4, 8, 0)),
}


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
                    f"{version_range(lowest, beyond)}")
    return None


def installed_versions() -> dict[str, str | None]:
    """Each distribution of SUPPORTED -> its installed version (None when absent)."""
    return {name: installed_version(name) for name in SUPPORTED}


def load_lse_target() -> Callable[..., dict[str, Any]]:
    """QuACK's GEMM with the LSE and target-logit epilogue, imported on first use."""
    try:
        module = importlib.import_module(f"{MODULE}.epilogue.library")
    except ImportError as exc:
        raise ImportError(
            f"the quack backend needs QuACK: pip install 'rlk-quack[quack]' "
            f"(quack-kernels {version_range(*SUPPORTED['quack-kernels'])}, nvidia-cutlass-dsl "
            f"{version_range(*SUPPORTED['nvidia-cutlass-dsl'])})"
        ) from exc
    epilogue: Callable[..., dict[str, Any]] = module.lse_target_epi
    return epilogue
