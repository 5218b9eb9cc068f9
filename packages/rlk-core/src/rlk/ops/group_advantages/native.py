"""Native group_advantages: per-group statistics with index_add, float32 throughout."""

from __future__ import annotations

import torch
from torch import Tensor

from rlk.ops.group_advantages.options import GroupAdvantagesOptions


def _group_sum(values: Tensor, group_ids: Tensor, num_groups: int) -> Tensor:
    return values.new_zeros(num_groups).index_add_(0, group_ids, values)


def batch_std(rewards: Tensor, valid: Tensor) -> Tensor:
    """The sample std of the batch's valid rewards: TRL's scale_rewards="batch" scale. With
    fewer than two it is 0, or NaN when the one reward is (so that under nan="propagate" a
    NaN reward poisons the batch whatever its size)."""
    count = valid.sum().to(rewards.dtype)
    kept = torch.where(valid, rewards, 0.0)
    mean = kept.sum() / count.clamp(min=1.0)
    squares = torch.where(valid, (rewards - mean) ** 2, 0.0).sum()
    return torch.where(count > 1, (squares / (count - 1).clamp(min=1.0)).sqrt(), kept.sum() * 0.0)


def forward(rewards: Tensor, group_ids: Tensor | None, group_size: int, num_groups: int,
            options: GroupAdvantagesOptions) -> Tensor:
    """Rewards minus the group (or leave-one-out) mean, optionally over a std.

    Deviations are taken from each group's minimum first, so a constant group gives
    exactly 0 (no rounding residue for eps to blow up) and never NaN. A NaN reward makes
    its whole group NaN (the whole batch under batch-std), or under nan="ignore" is left
    out of every statistic and gets 0. A group of one under singleton="reward" keeps its
    reward, divided by 1 + eps under std and by nothing else.
    """
    if group_ids is None:
        group_ids = torch.arange(rewards.shape[0], device=rewards.device) // max(group_size, 1)
    ignore = options.nan == "ignore"
    valid = ~rewards.isnan() if ignore else torch.ones_like(rewards, dtype=torch.bool)
    counts = _group_sum(valid.to(rewards.dtype), group_ids, num_groups)
    low = torch.full((num_groups,), torch.inf, dtype=rewards.dtype, device=rewards.device)
    low = low.scatter_reduce(0, group_ids, torch.where(valid, rewards, torch.inf),
                             reduce="amin")
    centred = torch.where(valid, rewards - low[group_ids], 0.0)
    sums = _group_sum(centred, group_ids, num_groups)
    count = counts[group_ids]
    if options.baseline == "mean":
        advantages = centred - sums[group_ids] / count.clamp(min=1.0)
    else:  # leave-one-out: the mean of the other members
        advantages = centred - (sums[group_ids] - centred) / (count - 1).clamp(min=1.0)
    single = count == 1
    if options.normalize == "std":
        spread = torch.where(valid, centred - (sums / counts.clamp(min=1.0))[group_ids], 0.0)
        squares = _group_sum(spread * spread, group_ids, num_groups)
        std = (squares / (counts - 1).clamp(min=1.0)).sqrt()[group_ids]
    elif options.normalize == "batch-std":
        std = batch_std(rewards, valid).expand_as(rewards)
    if options.singleton == "reward":  # verl: baseline 0 and, for the group std, std 1
        advantages = torch.where(single, rewards, advantages)
        if options.normalize == "std":
            std = torch.where(single, 1.0, std)
    else:
        advantages = torch.where(single, 0.0, advantages)
    if options.normalize != "none":
        scaled = advantages / (std + options.eps)
        unscaled = advantages == 0
        if options.normalize == "batch-std" and options.singleton == "reward":
            unscaled = unscaled | single  # the batch's scale is not the singleton's
        advantages = torch.where(unscaled, advantages, scaled)
    if ignore:
        return torch.where(valid, advantages, 0.0)
    poisoned = (_group_sum(rewards.isnan().to(rewards.dtype), group_ids, num_groups) > 0)[group_ids]
    if options.normalize == "batch-std":  # a NaN reward makes the batch's std NaN
        poisoned = poisoned | std.isnan()
    return torch.where(poisoned, torch.nan, advantages)
