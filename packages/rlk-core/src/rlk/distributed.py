"""Vocabulary parallelism: `logp` and `logp_entropy` of logits sharded by vocabulary.

Each rank of a process group holds a contiguous slice of the vocabulary, in rank order
(shard sizes may differ); the functions here take that rank's logits (for example the
output of a column-parallel LM head) and return, on every rank, what `rlk.logp` returns
on the concatenated logits, forward and backward, to float32 rounding. Every rank must
pass the same tokens, temperature and upstream gradient. `rlk.linear_logp(..., group=)`
does the same from a sharded LM head. These are the ops `distributed_logp` and
`distributed_logp_entropy` (`rlk.explain`, the conformance kit); the shard math they share
with backends is in rlk._runtime.shards (for plugins: rlk.backend).
"""

from __future__ import annotations

# Plugins written for plugin API 1.0 found the shard helpers here; rlk.backend has them now.
from rlk._runtime.shards import (
    KERNEL_BAD,
    KERNEL_IGNORE,
    Layout,
    backward_tokens,
    forward_tokens,
    layout,
    merge,
    padded,
)
from rlk.ops.distributed_logp.op import logp, logp_entropy

__all__ = [
    "KERNEL_BAD",
    "KERNEL_IGNORE",
    "Layout",
    "backward_tokens",
    "forward_tokens",
    "layout",
    "logp",
    "logp_entropy",
    "merge",
    "padded",
]
