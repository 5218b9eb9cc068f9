"""The op x backend table for one device: who is selected, and why each other one is not."""

from __future__ import annotations

from typing import Any

import torch

from rlk._runtime.spec import OpSpec, specs
from rlk.dispatch import current_policy, get_dispatcher


def representative_dtype(spec: OpSpec, device: torch.device) -> torch.dtype:
    """The dtype an RL trainer would use: bf16 on GPUs, float32 elsewhere, if the op takes it."""
    preferred = torch.bfloat16 if device.type == "cuda" else torch.float32
    return preferred if preferred in spec.dtypes else spec.dtypes[0]


def meta_args(spec: OpSpec, dtype: torch.dtype) -> dict[str, Any]:
    """Kernel arguments of the op's first conformance sample, on the meta device (no memory)."""
    sample = next(iter(spec.samples(torch.device("meta"), dtype)))
    return sample.args


def device_matrix(device: torch.device) -> dict[str, dict[str, Any]]:
    dispatcher = get_dispatcher()
    policy = current_policy(dispatcher)
    table: dict[str, dict[str, Any]] = {}
    for name, spec in specs().items():
        dtype = representative_dtype(spec, device)
        selection = dispatcher.decide(name, device, dtype, meta_args(spec, dtype), policy)
        table[name] = {
            "dtype": str(dtype).replace("torch.", ""),
            "selected": selection.backend,
            "kernel": selection.kernel_name,
            "uses": list(selection.uses),
            "rejected": dict(selection.rejected),
        }
    return table
