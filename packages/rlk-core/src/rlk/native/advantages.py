"""Native group_advantages: per-group statistics with index_add, float32 throughout."""

from __future__ import annotations

import torch
from torch import Tensor


def _group_sum(values: Tensor, group_ids: Tensor, num_groups: int) -> Tensor:
    return values.new_zeros(num_groups).index_add_(0, group_ids, values)


def forward(rewards: Tensor, group_ids: Tensor, num_groups: int, normalize: str, baseline: str,
            eps: float) -> Tensor:
    """Rewards minus the group (or leave-one-out) mean, optionally over the group std.

    Deviations are taken from each group's minimum first, so a constant group gives
    exactly 0 (no rounding residue for eps to blow up) and never NaN.
    """
    counts = _group_sum(torch.ones_like(rewards), group_ids, num_groups)
    low = torch.full((num_groups,), torch.inf, dtype=rewards.dtype, device=rewards.device)
    low = low.scatter_reduce(0, group_ids, rewards, reduce="amin")
    centred = rewards - low[group_ids]
    sums = _group_sum(centred, group_ids, num_groups)
    count = counts[group_ids]
    if baseline == "mean":
        advantages = centred - sums[group_ids] / count
    else:  # leave-one-out: the mean of the other members; 0 for a group of one
        advantages = centred - (sums[group_ids] - centred) / (count - 1).clamp(min=1)
    if normalize == "std":
        spread = centred - (sums / counts.clamp(min=1))[group_ids]
        squares = _group_sum(spread * spread, group_ids, num_groups)
        std = (squares / (counts - 1).clamp(min=1)).sqrt()
        scaled = advantages / (std[group_ids] + eps)
        advantages = torch.where(advantages == 0, 0.0, scaled)
    return advantages
