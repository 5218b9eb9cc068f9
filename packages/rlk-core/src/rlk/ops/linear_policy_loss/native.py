"""The native `linear_policy_loss` kernel: the shared loop (`loop.py`) with torch's ops."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch.distributed as dist
from torch import Tensor

from rlk._runtime.temperature import Temperature
from rlk.ops.linear_policy_loss.loop import ChunkOps, choose_path, describe, run


def forward(hidden: Tensor, weight: Tensor, tokens: Tensor, bias: Tensor | None,
            temperature: Temperature, ignore_index: int, group: dist.ProcessGroup | None,
            softcap: float | None, entropy_coef: float, policy: Mapping[str, Any],
            needs_input_grad: tuple[bool, bool, bool]) -> tuple[Tensor, ...]:
    ops = ChunkOps(hidden, weight, bias, softcap, group)
    return run(ops, tokens, temperature, ignore_index, entropy_coef, policy, needs_input_grad)


def plan(hidden: Tensor, weight: Tensor, policy: Mapping[str, Any], **_: Any) -> str:
    """Which path `forward` takes for these kernel arguments, in words (for rlk.explain)."""
    length = policy["mask"].shape[1]
    ops = ChunkOps(hidden, weight, None, None, None)
    path = choose_path(hidden.shape[0], length, ops.chunk_rows(), policy)
    return describe(path, ops.chunk_rows(), length)


forward.plan = plan  # type: ignore[attr-defined]
