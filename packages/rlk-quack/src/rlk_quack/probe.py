"""Can the quack backend serve a device? One cheap answer from metadata; QuACK stays unimported.

QuACK's GEMMs are written for Hopper (sm_90) and Blackwell (sm_100) tensor cores, and the
DSL compiles each kernel for the device on first use, so the probe asks for one of those.
"""

from __future__ import annotations

import torch

from rlk_quack import library

# compute capability majors QuACK 0.6.5's dense GEMM serves (gemm_sm90, gemm_sm100)
MAJORS = (9, 10)


def probe(device: torch.device) -> str | None:
    """None when QuACK can serve `device`, else a one-line reason."""
    if not library.is_installed():
        return "quack is not installed (pip install 'rlk-quack[quack]': docs/backends/quack.md)"
    return library.version_reason(library.installed_versions()) or device_reason(device)


def device_reason(device: torch.device) -> str | None:
    """None for a visible NVIDIA device of compute capability 9.x or 10.x."""
    if device.type != "cuda":
        return f"no CUDA device (QuACK runs on NVIDIA GPUs; asked for {device.type})"
    if torch.version.hip is not None:
        return "no CUDA device (this torch is a ROCm build; QuACK supports NVIDIA only)"
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        return f"no CUDA device {device} (torch sees {torch.cuda.device_count()})"
    major, minor = torch.cuda.get_device_capability(index)
    if major not in MAJORS:
        return (f"device is sm_{major}{minor}; QuACK's GEMM needs sm_90 (Hopper) or "
                "sm_100 (Blackwell)")
    return None
