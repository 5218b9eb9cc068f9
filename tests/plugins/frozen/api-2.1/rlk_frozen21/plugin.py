"""The entry point: an entropy backend for the CPU, its version read with a 2.1 helper."""

from __future__ import annotations

import torch

from rlk.backend import FLOAT_DTYPES, Registry, hookimpl, installed_version

RLK_PLUGIN_API = "2.1"


def probe(device: torch.device) -> str | None:
    return None if device.type == "cpu" else f"serves the CPU, not {device.type}"


@hookimpl
def rlk_register(registry: Registry) -> None:
    version = installed_version("rlk-frozen21") or "unknown"
    registry.add_backend("frozen21", priority=10, probe=probe, version=version)
    registry.add_kernel("entropy", "frozen21", "rlk_frozen21.kernels:forward",
                        backward="rlk_frozen21.kernels:backward", devices=("cpu",),
                        dtypes=(*FLOAT_DTYPES, torch.float64))
