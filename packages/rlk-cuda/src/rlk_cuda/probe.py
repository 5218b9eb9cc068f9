"""The backend's probe: can rlk-cuda serve a device, and if not, why (one line)."""

from __future__ import annotations

import re

import torch

from rlk_cuda import _ext

_ARCH = re.compile(r"^(\d+?)(\d)(a|f)?(-real|-virtual)?$")


def _parse(arch: str) -> tuple[int, int, str, str]:
    match = _ARCH.match(arch.strip())
    if match is None:
        raise ValueError(f"unrecognised CUDA architecture {arch!r}")
    major, minor, suffix, kind = match.groups()
    return int(major), int(minor), suffix or "", kind or ""


def runs_on(arch: str, capability: tuple[int, int]) -> bool:
    """Whether code built for `arch` (a CMake CUDA_ARCHITECTURES entry) runs on `capability`.

    '90a'-style targets run only on that exact chip; plain targets ('80') carry machine code for
    their major version and PTX that newer chips compile at load time; '-real' has no PTX.
    """
    major, minor, suffix, kind = _parse(arch)
    if suffix:
        return capability == (major, minor)
    if kind == "-real":
        return capability[0] == major and capability[1] >= minor
    return capability >= (major, minor)


def arch_mismatch(archs: list[str], capability: tuple[int, int]) -> str | None:
    """None when one of `archs` runs on `capability`, else the one-line reason."""
    if any(runs_on(a, capability) for a in archs):
        return None
    built = ";".join(f"sm_{a}" for a in archs)
    return f"built for {built}, device is sm_{capability[0]}{capability[1]}"


def probe(device: torch.device) -> str | None:
    """None when rlk-cuda can serve `device`. Uses torch metadata; creates no CUDA context."""
    if device.type != "cuda":
        return f"no CUDA device (rlk-cuda serves cuda devices, got {device.type})"
    if torch.version.hip is not None:
        return "torch is a ROCm build; use rlk-rocm on AMD GPUs"
    if torch.version.cuda is None or not torch.cuda.is_available():
        return "no CUDA device"
    error = _ext.import_error()
    if error is not None:
        return f"extension failed to import: {error}"
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        return f"no CUDA device with index {index} (found {torch.cuda.device_count()})"
    return arch_mismatch(_ext.architectures(), torch.cuda.get_device_capability(index))
