"""The `group_advantages` kernel: deterministic float64 group statistics, one team per group.

A warp serves each group when groups are small, a block when they are large; consecutive
groups of a fixed size (group_size=) are read as runs without any id tensor, ids in order as
runs found by search, ids in any other order by scanning for members.
"""

from __future__ import annotations

import torch
from rlk.backend import NORMALIZATIONS, GroupAdvantagesOptions
from torch import Tensor

from . import _ext
from ._launch import device_of, ptr, same_device, stream


def forward(rewards: Tensor, group_ids: Tensor | None, group_size: int, num_groups: int,
            options: GroupAdvantagesOptions) -> Tensor:
    """Reward minus the group (or leave-one-out) mean, optionally over the group's or the
    batch's sample std; see rlk.native.advantages for the conventions (constant groups give
    exactly 0, groups of one, NaN rewards)."""
    device = device_of("rewards", rewards)
    rewards = rewards.to(torch.float32).contiguous()
    out = torch.empty_like(rewards)
    if rewards.numel() == 0:
        return out
    ext = _ext.load()
    ids = ordered_chunks = None
    if group_ids is not None:
        same_device("group_ids", group_ids, device)
        ids = group_ids.to(torch.int64).contiguous()
        chunks = -(-rewards.numel() // ext.GROUP_ADVANTAGES_CHUNK)
        ordered_chunks = torch.empty(chunks, dtype=torch.int32, device=rewards.device)
    elif group_size < 1:
        raise ValueError(f"group_size must be >= 1 without group_ids; got {group_size}")
    batch_std = (torch.empty(1, dtype=torch.float64, device=rewards.device)
                 if options.normalize == "batch-std" else None)
    ext.group_advantages(
        device=device, stream=stream(device), rewards=ptr(rewards), group_ids=ptr(ids),
        N=rewards.numel(), num_groups=int(num_groups), group_size=int(group_size),
        normalize=NORMALIZATIONS.index(options.normalize),  # rlk_api.h GroupAdvNormalize
        leave_one_out=options.baseline == "loo", nan_ignore=options.nan == "ignore",
        singleton_reward=options.singleton == "reward", eps=options.eps, out=ptr(out),
        ordered_chunks=ptr(ordered_chunks), batch_std=ptr(batch_std))
    return out
