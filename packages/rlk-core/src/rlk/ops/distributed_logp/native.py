"""Native distributed_logp / distributed_logp_entropy kernels: this rank's slice of the
vocabulary through the selected `logp` kernel, merged across the group (rlk._runtime.shards)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from rlk._runtime import shards
from rlk._runtime.chunks import rows_per_chunk
from rlk._runtime.contract import BoundKernel
from rlk._runtime.temperature import Temperature
from rlk.ops.logp.op import LOGP, LOGP_ENTROPY


def _logp_args(logits: Tensor, tokens: Tensor, temperature: Temperature,
               with_entropy: bool) -> dict[str, Any]:
    return {"logits": logits, "tokens": tokens, "temperature": temperature,
            "ignore_index": shards.KERNEL_IGNORE, "rows": None, "out": None,
            "with_entropy": with_entropy}


def _logp_kernel(args: Mapping[str, Any]) -> BoundKernel:
    return (LOGP_ENTROPY if args["with_entropy"] else LOGP).kernel(args)


def forward(logits: Tensor, tokens: Tensor, temperature: Temperature, ignore_index: int,
            group: dist.ProcessGroup,
            with_entropy: bool) -> tuple[Tensor, Tensor | None, Tensor]:
    """Global (logp, entropy, lse) from this rank's [N, V_local] logits."""
    shard = shards.layout(logits.shape[1], group, logits.device)
    local, owned = shards.forward_tokens(tokens, shard)
    args = _logp_args(logits, local, temperature, with_entropy)
    picked, entropy, lse = _logp_kernel(args).forward(**args)
    return shards.merge(lse, entropy, picked, owned, tokens, shard, ignore_index, group)


def backward(grad_logp: Tensor, grad_entropy: Tensor | None, logits: Tensor, tokens: Tensor,
             temperature: Temperature, ignore_index: int, group: dist.ProcessGroup, lse: Tensor,
             entropy: Tensor | None) -> Tensor:
    """This rank's slice of the logits gradient, one row chunk of padded logits at a time."""
    shard = shards.layout(logits.shape[1], group, logits.device)
    codes = shards.backward_tokens(tokens, shard, ignore_index)
    grad = torch.empty_like(logits)
    step = rows_per_chunk(logits.shape[1] + 1, 4)
    kernel = None
    for start in range(0, logits.shape[0], step):
        stop = min(start + step, logits.shape[0])
        temp = temperature[start:stop] if isinstance(temperature, Tensor) else temperature
        chunk = shards.padded(logits[start:stop])
        args = _logp_args(chunk, codes[start:stop], temp, entropy is not None)
        kernel = kernel or _logp_kernel(args)
        chunk_grad = kernel.backward(
            grad_logp[start:stop],
            None if grad_entropy is None else grad_entropy[start:stop],
            chunk, codes[start:stop], temp, shards.KERNEL_IGNORE, None, lse[start:stop],
            None if entropy is None else entropy[start:stop], True,
        )
        grad[start:stop] = chunk_grad[:, :-1]
    return grad
