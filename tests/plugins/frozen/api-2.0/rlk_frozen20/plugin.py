"""The entry point: the backend and its kernels, declared without importing kernel code."""

from __future__ import annotations

import torch

from rlk.backend import FLOAT_DTYPES, Registry, hookimpl, one_token_per_row

RLK_PLUGIN_API = "2.0"


def probe(device: torch.device) -> str | None:
    return None if device.type == "cpu" else f"serves the CPU, not {device.type}"


@hookimpl
def rlk_register(registry: Registry) -> None:
    registry.add_backend("frozen20", priority=10, probe=probe, version="2.0.0")
    for op in ("logp", "logp_entropy"):
        registry.add_kernel(op, "frozen20", "rlk_frozen20.kernels:forward",
                            backward="rlk_frozen20.kernels:backward", devices=("cpu",),
                            dtypes=(*FLOAT_DTYPES, torch.float64), check=one_token_per_row)
