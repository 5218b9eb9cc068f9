"""NVIDIA's binary tools for the tests that read machine code (test_sass, test_fatbin)."""

from __future__ import annotations

import shutil
from pathlib import Path


def tool(name: str) -> str | None:
    """`name` on PATH, else from NVIDIA's wheels (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm)."""
    found = shutil.which(name)
    if found:
        return found
    try:
        import nvidia.cu13  # type: ignore[import-not-found]
    except ImportError:
        return None
    for root in nvidia.cu13.__path__:
        candidate = Path(root) / "bin" / name
        if candidate.is_file():
            return str(candidate)
    return None
