"""The `group_advantages` kernel: deterministic float64 group statistics, one team per group.

A warp serves each group when groups are small, a block when they are large. Consecutive
groups of a fixed size (group_size=) are read as runs without any id tensor; group ids, in
whatever order they come, are first sorted stably on the device (no host sync), and each
group is then the run of its id in that order: O(N) work in the kernel, members summed in
their original order.
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
    batch's sample std; see rlk.ops.group_advantages.native for the conventions (constant
    groups give exactly 0, groups of one, NaN rewards). `group_ids`: ids in [0, num_groups),
    any order."""
    device = device_of("rewards", rewards)
    if rewards.dtype != torch.float32 or not rewards.is_contiguous():
        rewards = rewards.to(torch.float32).contiguous()
    out = torch.empty_like(rewards)
    if rewards.numel() == 0:
        return out
    ids = order = None
    if group_ids is not None:
        same_device("group_ids", group_ids, device)
        if group_ids.shape != rewards.shape:
            raise ValueError(f"group_ids must have the shape of rewards {tuple(rewards.shape)}; "
                             f"got {tuple(group_ids.shape)}")
        ids, order = torch.sort(group_ids.to(torch.int64), stable=True)
    elif group_size < 1:
        raise ValueError(f"group_size must be >= 1 without group_ids; got {group_size}")
    batch_std = (torch.empty(1, dtype=torch.float64, device=rewards.device)
                 if options.normalize == "batch-std" else None)
    ext = _ext.load()
    args = ext.GroupAdvArgs(
        rewards=rewards.data_ptr(), group_ids=ptr(ids), order=ptr(order), N=rewards.numel(),
        num_groups=int(num_groups), group_size=int(group_size),
        normalize=NORMALIZATIONS.index(options.normalize),  # rlk_api.h GroupAdvNormalize
        leave_one_out=options.baseline == "loo", nan_ignore=options.nan == "ignore",
        singleton_reward=options.singleton == "reward", eps=options.eps, out=out.data_ptr(),
        batch_std=ptr(batch_std))
    ext.group_advantages(device=device, stream=stream(device), args=args)
    return out
