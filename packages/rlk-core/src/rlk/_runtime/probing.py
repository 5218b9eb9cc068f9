"""What every GPU backend's probe asks, answered without importing its library or creating a
CUDA context: is a module there, which release of a distribution is installed, and is the
device a visible NVIDIA GPU."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys

import torch


def module_found(name: str) -> bool:
    """Whether `import name` would find a module, without importing it. One already in
    `sys.modules` counts; None there (a failed import, or a test blocking it) does not."""
    if name in sys.modules:
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def installed_version(distribution: str) -> str | None:
    """The version in `distribution`'s metadata (a pip name: "flashinfer-python"), or None
    when it is not installed. Reads metadata only, so the package is not imported."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def release(version: str, parts: int = 3) -> tuple[int, ...] | None:
    """The first `parts` numbers of a version string, zero-padded ("0.9.1.post2" -> (0, 9, 1),
    "4.7" -> (4, 7, 0)), so releases compare as tuples; None when it does not start with one."""
    found = re.match(r"\s*(\d+(?:\.\d+)*)", version)
    if found is None:
        return None
    numbers = [int(part) for part in found.group(1).split(".")][:parts]
    return tuple(numbers + [0] * (parts - len(numbers)))


def version_range(lowest: tuple[int, ...], beyond: tuple[int, ...]) -> str:
    """A supported range as pip writes it: ((1, 16), (1, 17)) -> ">=1.16,<1.17"."""
    return f">={'.'.join(map(str, lowest))},<{'.'.join(map(str, beyond))}"


def nvidia_device_reason(device: torch.device, library: str) -> str | None:
    """None for a visible NVIDIA CUDA device, else a one-line reason naming `library` (what
    the backend runs on): another device type, a ROCm torch, no CUDA, an index past the count."""
    if device.type != "cuda":
        return f"no CUDA device ({library} runs on NVIDIA GPUs; asked for {device.type})"
    if torch.version.hip is not None:
        return f"no CUDA device (this torch is a ROCm build; {library} supports NVIDIA only)"
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        return f"no CUDA device {device} (torch sees {count})"
    return None
