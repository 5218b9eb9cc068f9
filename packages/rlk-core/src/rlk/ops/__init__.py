"""Operator specs. Names here are the registry's op names and `torch.ops.rlk` names."""

from __future__ import annotations

OP_NAMES = (
    "logp",
    "logp_entropy",
    "linear_logp",
    "linear_logp_entropy",
    "policy_loss",
    "group_advantages",
    "sample",
)


def specs() -> dict[str, object]:
    """Every op's spec, by name (imports the op modules, which registers the torch ops)."""
    from rlk.ops import logp

    found = {spec.name: spec for spec in logp.SPECS}
    return found
