"""The `group_advantages` kernel: deterministic float64 group statistics, one team per group.

A warp serves each group when groups are small, a block when they are large; consecutive
groups (group_size=) are read as runs, ids in any other order by scanning for members.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import _ext
from ._launch import device_of, ptr, same_device, stream

NORMALIZE = ("std", "none")
BASELINES = ("mean", "loo")


def forward(
    rewards: Tensor, group_ids: Tensor, num_groups: int, normalize: str, baseline: str, eps: float
) -> Tensor:
    """Reward minus the group (or leave-one-out) mean, optionally over the group's sample std.

    Rewards are centred on their group's minimum first, so constant groups give exactly 0;
    a group with a NaN reward gives NaN for all its members.
    """
    if normalize not in NORMALIZE:
        raise ValueError(f"normalize must be one of {NORMALIZE}; got {normalize!r}")
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}; got {baseline!r}")
    device = device_of("rewards", rewards)
    same_device("group_ids", group_ids, device)
    rewards = rewards.to(torch.float32).contiguous()
    ids = group_ids.to(torch.int64).contiguous()
    out = torch.empty_like(rewards)
    if rewards.numel() == 0:
        return out
    ext = _ext.load()
    chunks = -(-rewards.numel() // ext.GROUP_ADVANTAGES_CHUNK)
    ordered_chunks = torch.empty(chunks, dtype=torch.int32, device=rewards.device)
    ext.group_advantages(
        device,
        stream(device),
        ptr(rewards),
        ptr(ids),
        rewards.numel(),
        int(num_groups),
        normalize == "std",
        baseline == "loo",
        float(eps),
        ptr(out),
        ptr(ordered_chunks),
    )
    return out
