"""`GroupAdvantagesOptions`: every option of `rlk.group_advantages`, its default and its
validation (the only place a default is written)."""

from __future__ import annotations

from typing import ClassVar

from rlk._runtime.options import Options, choice, number, option_set

NORMALIZATIONS = ("std", "batch-std", "none")
BASELINES = ("mean", "loo")

@option_set
class GroupAdvantagesOptions(Options):
    """How rewards become advantages (see docs/ops/group_advantages.md).

    normalize: "std" (the group's sample std), "batch-std" (the whole batch's, TRL's
    scale_rewards="batch") or "none" (Dr. GRPO); baseline: "mean" (GRPO) or "loo" (RLOO);
    eps: added to the std; nan: "propagate" (a NaN reward makes its group NaN) or "ignore"
    (TRL: a NaN reward gets advantage 0 and its group's statistics come from the rest);
    singleton: a group of one gets "zero" (rlk, TRL) or "reward" (verl: baseline 0 and
    std 1, so r / (1 + eps) under std scaling, r otherwise).
    """

    op_name: ClassVar[str] = "group_advantages"

    normalize: str = choice("std", NORMALIZATIONS)
    baseline: str = choice("mean", BASELINES)
    eps: float = number(1e-6, low=0.0)
    nan: str = choice("propagate", ("propagate", "ignore"))
    singleton: str = choice("zero", ("zero", "reward"))
