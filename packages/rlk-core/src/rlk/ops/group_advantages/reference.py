"""The float64 reference of `group_advantages`.

Float64 ground truth for tests and `rlk-core doctor --smoke` only: it favours clarity over
memory, so never call it on production-sized inputs.
"""

from __future__ import annotations

import torch

from rlk.ops.group_advantages.options import GroupAdvantagesOptions


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    options: GroupAdvantagesOptions | None = None,
) -> torch.Tensor:
    """Float64 group advantages, one group at a time.

    As TRL 1.16 (GRPO: r - mean, over the group's or, scale_rewards="batch", the batch's
    std plus eps; RLOO: r - (sum - r) / (n - 1); NaN rewards left out of the statistics and
    given 0) and verl 0.9.1 (compute_grpo_outcome_advantage / compute_rloo_outcome_advantage:
    a group of one has mean 0 and std 1) write them. Stds are Bessel-corrected. A group
    whose rewards are all equal gives 0; so does a group of one unless singleton="reward"
    (then r / (1 + eps) under std, r otherwise); a NaN reward under nan="propagate" makes
    its group NaN, the whole batch under batch-std.
    """
    o = options if options is not None else GroupAdvantagesOptions()
    f64 = torch.float64
    values = rewards.detach().to(f64)
    valid = ~values.isnan() if o.nan == "ignore" else torch.ones_like(values, dtype=torch.bool)
    kept = values[valid]
    # one reward has no spread: 0, or NaN when that reward is NaN
    batch_std = kept.std() if kept.numel() > 1 else kept.sum() * 0.0
    if o.normalize == "batch-std" and o.nan == "propagate" and bool(batch_std.isnan()):
        return torch.full_like(values, torch.nan)
    out = torch.zeros_like(values)
    for group in torch.unique(group_ids):
        members = ((group_ids == group) & valid).nonzero().squeeze(1)
        r = values[members]
        size = r.numel()
        if size == 0:
            continue
        if bool(r.isnan().any()):  # nan="propagate"
            out[members] = torch.nan
            continue
        if size == 1:
            mean, std = values.new_zeros(()), values.new_ones(())
            if o.singleton == "zero":
                out[members] = 0.0
                continue
        else:
            mean, std = r.mean(), r.std()
        adv = r - mean if o.baseline == "mean" or size == 1 else r - (r.sum() - r) / (size - 1)
        if o.normalize == "std":
            adv = adv / (std + o.eps)
        elif o.normalize == "batch-std" and size > 1:
            adv = adv / (batch_std + o.eps)
        if size > 1 and bool((r == r[0]).all()):
            adv = torch.zeros_like(r)
        out[members] = adv
    return out
