"""The op table: every operator rlk defines, by name, and where its spec lives.

Adding an op is one line here (docs/adding-an-op.md says which files an op owns). The
names are the registry's op names and the `torch.ops.rlk` names. Specs are imported only
when asked for, so the dispatcher (which the ops sit on) knows every name without them.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from rlk.registry import resolve

if TYPE_CHECKING:
    from rlk._runtime.spec import OpSpec

SPECS = {
    "logp": "rlk.ops.logp.op:LOGP",
    "logp_entropy": "rlk.ops.logp.op:LOGP_ENTROPY",
    "entropy": "rlk.ops.entropy.op:ENTROPY",
    "linear_logp": "rlk.ops.linear_logp.op:LINEAR_LOGP",
    "linear_logp_entropy": "rlk.ops.linear_logp.op:LINEAR_LOGP_ENTROPY",
    "linear_policy_loss": "rlk.ops.linear_policy_loss.op:LINEAR_POLICY_LOSS",
    "policy_loss": "rlk.ops.policy_loss.op:POLICY_LOSS",
    "group_advantages": "rlk.ops.group_advantages.op:GROUP_ADVANTAGES",
    "sample": "rlk.ops.sample.op:SAMPLE",
    "distributed_logp": "rlk.ops.distributed_logp.op:DISTRIBUTED_LOGP",
    "distributed_logp_entropy": "rlk.ops.distributed_logp.op:DISTRIBUTED_LOGP_ENTROPY",
}
OP_NAMES = tuple(SPECS)


def specs() -> dict[str, OpSpec]:
    """Every op's spec, by name (importing an op's module registers its torch ops)."""
    return dict(_specs())


@functools.cache
def _specs() -> dict[str, OpSpec]:
    found = {}
    for name, target in SPECS.items():
        spec = resolve(target)
        if spec.name != name:
            raise RuntimeError(f"rlk.ops.SPECS maps '{name}' to {target}, whose name is "
                               f"'{spec.name}'")
        found[name] = spec
    return found
