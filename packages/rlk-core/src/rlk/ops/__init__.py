"""Operator specs. Names here are the registry's op names and `torch.ops.rlk` names."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlk.ops.spec import OpSpec

OP_NAMES = (
    "logp",
    "logp_entropy",
    "entropy",
    "linear_logp",
    "linear_logp_entropy",
    "linear_policy_loss",
    "policy_loss",
    "group_advantages",
    "sample",
)


def specs() -> dict[str, OpSpec]:
    """Every op's spec, by name (imports the op modules, which registers the torch ops)."""
    from rlk.ops import (
        advantages,
        entropy,
        linear_logp,
        linear_policy_loss,
        logp,
        policy_loss,
        sample,
    )

    modules = (logp, entropy, linear_logp, linear_policy_loss, policy_loss, advantages, sample)
    found = {spec.name: spec for module in modules for spec in module.SPECS}
    return found
