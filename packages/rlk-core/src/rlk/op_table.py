"""The op table: every operator rlk defines, by name, and where its spec lives.

This is the only list of ops. The names are the registry's op names and the `torch.ops.rlk`
names; each entry names the op's spec as "module:attribute" in the op's folder,
`rlk/ops/<op>/` (an `_entropy` variant shares the folder of the op it extends). The module
imports nothing, so the dispatcher and the registry below the ops know every name without
importing an op; `rlk._runtime.spec.specs()` imports the specs on first use, as the loader
imports plugins' entry points. Adding an op is one line here (docs/adding-an-op.md).
"""

from __future__ import annotations

SPECS = {
    "logp": "rlk.ops.logp.op:LOGP",
    "logp_entropy": "rlk.ops.logp.op:LOGP_ENTROPY",
    "entropy": "rlk.ops.entropy.op:ENTROPY",
    "linear_logp": "rlk.ops.linear_logp.op:LINEAR_LOGP",
    "linear_logp_entropy": "rlk.ops.linear_logp.op:LINEAR_LOGP_ENTROPY",
    "linear_policy_loss": "rlk.ops.linear_policy_loss.op:LINEAR_POLICY_LOSS",
    "policy_loss": "rlk.ops.policy_loss.op:POLICY_LOSS",
    "token_kl": "rlk.ops.token_kl.op:TOKEN_KL",
    "group_advantages": "rlk.ops.group_advantages.op:GROUP_ADVANTAGES",
    "sample": "rlk.ops.sample.op:SAMPLE",
    "distributed_logp": "rlk.ops.distributed_logp.op:DISTRIBUTED_LOGP",
    "distributed_logp_entropy": "rlk.ops.distributed_logp.op:DISTRIBUTED_LOGP_ENTROPY",
}
OP_NAMES = tuple(SPECS)
