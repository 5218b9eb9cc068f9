"""Native linear_logp: float32 logits one row chunk at a time, fed to the selected logp kernels.

The [N, V] logits never exist: each chunk of rows is multiplied out in float32
(rlk._runtime.lm_head), soft-capped if asked, handed to the logp kernel the dispatcher picks for
it (so a GPU backend's fused logp serves this path too), and dropped. The backward
recomputes the chunk's logits, turns them into the logits gradient in place, and folds it
into the hidden, weight and bias gradients, returned in float32 (weight and bias accumulate
in float32 across chunks; the op rounds each once, to its caller's dtype).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from rlk._runtime import lm_head, shards
from rlk._runtime.chunks import rows_per_chunk
from rlk._runtime.temperature import Temperature

# Chunk-sized float32 buffers alive at once: the logits chunk, the logp kernel's three
# temporaries, the soft-cap slope and the GEMM operand copy of the logits gradient.
_LIVE = 6


def _chunks(rows: int, width: int) -> Iterator[tuple[int, int]]:
    step = rows_per_chunk(width, _LIVE)
    for start in range(0, rows, step):
        yield start, min(rows, start + step)


def _logits(hidden: Tensor, weight: Tensor, bias: Tensor | None, softcap: float | None,
            pad: bool) -> Tensor:
    """Float32 (soft-capped) logits; with `pad`, one more column of -inf (never capped)."""
    vocab = weight.shape[0]
    out = torch.empty(hidden.shape[0], vocab + (1 if pad else 0), dtype=torch.float32,
                      device=hidden.device)
    view = out[:, :vocab]
    lm_head.soft_cap_(lm_head.float32_logits(hidden, weight, bias, out=view), softcap)
    if pad:
        out[:, -1] = -torch.inf
    return out


def _slice(temperature: Temperature, start: int, stop: int) -> Temperature:
    return temperature[start:stop] if isinstance(temperature, Tensor) else temperature


def _logp_kernel(logits: Tensor, tokens: Tensor, temperature: Temperature, ignore_index: int,
                 with_entropy: bool) -> Any:
    """The logp kernel the dispatcher selects for a chunk like this one."""
    from rlk.ops.logp.op import LOGP, LOGP_ENTROPY

    args = {"logits": logits, "tokens": tokens, "temperature": temperature,
            "ignore_index": ignore_index, "rows": None, "out": None,
            "with_entropy": with_entropy}
    return (LOGP_ENTROPY if with_entropy else LOGP).kernel(args)


def forward(hidden: Tensor, weight: Tensor, tokens: Tensor, bias: Tensor | None,
            temperature: Temperature, ignore_index: int, with_entropy: bool,
            group: dist.ProcessGroup | None,
            softcap: float | None) -> tuple[Tensor, Tensor | None, Tensor]:
    rows = hidden.shape[0]
    shard = None if group is None else shards.layout(weight.shape[0], group, hidden.device)
    owned = None
    codes, kernel_ignore = tokens, ignore_index
    if shard is not None:
        codes, owned = shards.forward_tokens(tokens, shard)
        kernel_ignore = shards.KERNEL_IGNORE
    options: dict[str, Any] = {"dtype": torch.float32, "device": hidden.device}
    logp, entropy = torch.empty(rows, **options), None
    lse = torch.empty(rows, dtype=torch.float64, device=hidden.device)  # the logp kernels'
    if with_entropy:
        entropy = torch.empty(rows, **options)
    operand = lm_head.gemm_weight(weight)
    temperature = lm_head.kernel_temperature(temperature, softcap)
    kernel = None
    for start, stop in _chunks(rows, weight.shape[0]):
        logits = _logits(hidden[start:stop], operand, bias, softcap, pad=False)
        temp = _slice(temperature, start, stop)
        kernel = kernel or _logp_kernel(logits, codes[start:stop], temp, kernel_ignore,
                                        with_entropy)
        part_logp, part_entropy, part_lse = kernel.forward(
            logits, codes[start:stop], temp, kernel_ignore, None, None, with_entropy
        )
        logp[start:stop], lse[start:stop] = part_logp, part_lse
        if entropy is not None and part_entropy is not None:
            entropy[start:stop] = part_entropy
    if shard is None or group is None or owned is None:
        return logp, entropy, lse
    return shards.merge(lse, entropy, logp, owned, tokens, shard, ignore_index, group)


def backward(grad_logp: Tensor, grad_entropy: Tensor | None, hidden: Tensor, weight: Tensor,
             tokens: Tensor, bias: Tensor | None, temperature: Temperature, ignore_index: int,
             group: dist.ProcessGroup | None, lse: Tensor, entropy: Tensor | None,
             needs_input_grad: tuple[bool, bool, bool],
             softcap: float | None) -> tuple[Tensor | None, ...]:
    need_hidden, need_weight, need_bias = needs_input_grad
    need_bias = need_bias and bias is not None
    rows, vocab = hidden.shape[0], weight.shape[0]
    sharded = group is not None
    codes, kernel_ignore = tokens, ignore_index
    if group is not None:
        shard = shards.layout(vocab, group, hidden.device)
        codes = shards.backward_tokens(tokens, shard, ignore_index)
        kernel_ignore = shards.KERNEL_IGNORE
    grad_hidden = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device) \
        if need_hidden else None
    grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) \
        if need_weight else None
    grad_bias = torch.zeros(vocab, dtype=torch.float32, device=weight.device) \
        if need_bias else None
    operand = lm_head.gemm_weight(weight)
    temperature = lm_head.kernel_temperature(temperature, softcap)
    kernel = None
    for start, stop in _chunks(rows, vocab + int(sharded)):
        chunk = hidden[start:stop]
        logits = _logits(chunk, operand, bias, softcap, pad=sharded)
        slope = None if softcap is None else lm_head.soft_cap_slope(
            logits[:, :vocab], softcap, codes[start:stop] == kernel_ignore)
        temp = _slice(temperature, start, stop)
        chunk_entropy = None if entropy is None else entropy[start:stop]
        kernel = kernel or _logp_kernel(logits, codes[start:stop], temp, kernel_ignore,
                                        entropy is not None)
        grad_logits = kernel.backward(
            grad_logp[start:stop], None if grad_entropy is None else grad_entropy[start:stop],
            logits, codes[start:stop], temp, kernel_ignore, None, lse[start:stop],
            chunk_entropy, True,
        )[:, :vocab]
        if slope is not None:
            grad_logits.mul_(slope)
        if grad_hidden is not None:
            # grad_logits @ weight by the logits' float32-output GEMM
            lm_head.float32_logits(grad_logits, operand.t(), None, out=grad_hidden[start:stop])
        if grad_weight is not None:
            # ignored rows have a zero logits gradient; their hidden state may be NaN
            ignored = (tokens[start:stop] == ignore_index).unsqueeze(1)
            wide = chunk.to(torch.float32, copy=True).masked_fill_(ignored, 0.0)
            grad_weight.addmm_(grad_logits.t(), wide)
        if grad_bias is not None:
            grad_bias += grad_logits.sum(dim=0)
    if grad_hidden is not None and group is not None:
        dist.all_reduce(grad_hidden, op=dist.ReduceOp.SUM, group=group)
    return grad_hidden, grad_weight, grad_bias
