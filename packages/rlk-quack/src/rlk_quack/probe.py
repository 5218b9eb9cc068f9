"""Can the quack backend serve a device? One cheap answer from metadata; QuACK stays unimported.

QuACK's GEMMs are written for Hopper (sm_90) and Blackwell (sm_100) tensor cores, and the
DSL compiles each kernel for the device on first use, so the probe asks for one of those.
"""

from __future__ import annotations

import torch

from rlk.backend import module_found, nvidia_device_reason
from rlk_quack import library

# compute capability majors QuACK 0.6.5's dense GEMM serves (gemm_sm90, gemm_sm100)
MAJORS = (9, 10)


def probe(device: torch.device) -> str | None:
    """None when QuACK can serve `device`, else a one-line reason."""
    if not module_found(library.MODULE):
        return "quack is not installed (pip install 'rlk-quack[quack]': docs/backends/quack.md)"
    return library.version_reason(library.installed_versions()) or device_reason(device)


def device_reason(device: torch.device) -> str | None:
    """None for a visible NVIDIA device of compute capability 9.x or 10.x."""
    reason = nvidia_device_reason(device, "QuACK")
    if reason is not None:
        return reason
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    if major not in MAJORS:
        return (f"device is sm_{major}{minor}; QuACK's GEMM needs sm_90 (Hopper) or "
                "sm_100 (Blackwell)")
    return None
