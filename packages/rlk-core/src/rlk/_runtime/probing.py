"""What every GPU backend's probe asks, answered without importing its library or creating a
CUDA context: is a module there, and is the device a visible NVIDIA GPU."""

from __future__ import annotations

import importlib.util
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
