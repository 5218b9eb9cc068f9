"""Vocabulary parallelism: log-probabilities when the vocabulary is split across ranks.

Each rank of a process group holds a contiguous slice of the vocabulary, in rank
order (shard sizes may differ). Every rank computes softmax statistics over its
own slice; two collectives merge them (a MAX, then one SUM of three numbers per
row), so forward and backward equal the unsharded op to float32 rounding while
no rank ever holds the whole vocabulary.

`logp` / `logp_entropy` here take logits already sharded by vocabulary (for
example the output of a column-parallel LM head). `rlk.linear_logp(..., group=)`
uses the same merge on logits it computes chunk by chunk from a sharded weight.
Every rank must pass the same tokens, temperature and upstream gradient (they are
replicated, as in Megatron-style tensor parallelism).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from rlk import config
from rlk.ops import temperature as temperatures
from rlk.ops import validate
from rlk.ops.spec import register_autograd
from rlk.ops.temperature import Temperature

# Local token codes the logp kernels receive for rows whose global token is special.
KERNEL_IGNORE = -1  # the global token is ignore_index: zero gradient
KERNEL_BAD = -2  # the global token is outside the global vocabulary: NaN


def group_name(group: Any) -> str:
    """The name a torch op carries for a process group ("" for none)."""
    if group is None:
        return ""
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a torch.distributed.ProcessGroup or None, "
                        f"got {type(group).__name__}")
    if not dist.is_initialized():
        raise ValueError("group= needs torch.distributed to be initialised "
                         "(torch.distributed.init_process_group)")
    return group.group_name


def resolve(name: str) -> dist.ProcessGroup | None:
    """The process group behind a name made by `group_name`."""
    if not name:
        return None
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(name)  # type: ignore[arg-type]  # GroupName is a str


@dataclass(frozen=True)
class Layout:
    """Where this rank's vocabulary slice sits: [offset, offset + local) of `total`."""

    offset: int
    local: int
    total: int


def layout(local: int, group: dist.ProcessGroup, device: torch.device) -> Layout:
    """Every rank's shard size, gathered once per call (shards are contiguous, in rank order)."""
    size = torch.tensor([local], dtype=torch.int64, device=device)
    sizes = [torch.empty_like(size) for _ in range(dist.get_world_size(group))]
    dist.all_gather(sizes, size, group=group)
    counts = [int(s.item()) for s in sizes]
    rank = dist.get_rank(group)
    return Layout(offset=sum(counts[:rank]), local=local, total=sum(counts))


def forward_tokens(tokens: Tensor, shard: Layout) -> tuple[Tensor, Tensor]:
    """Local token ids for the forward (0 where the token lives elsewhere), and ownership."""
    local = tokens - shard.offset
    owned = (local >= 0) & (local < shard.local)
    return torch.where(owned, local, 0), owned


def backward_tokens(tokens: Tensor, shard: Layout, ignore_index: int) -> Tensor:
    """Local token ids for the backward of logits padded with one -inf column.

    Tokens owned by another rank point at the padding column, whose probability
    is 0, so the kernel adds their one-hot term there and nowhere that matters.
    """
    local = tokens - shard.offset
    owned = (local >= 0) & (local < shard.local)
    codes = torch.where(owned, local, shard.local)
    codes = torch.where((tokens < 0) | (tokens >= shard.total), KERNEL_BAD, codes)
    return torch.where(tokens == ignore_index, KERNEL_IGNORE, codes)


def merge(lse: Tensor, entropy: Tensor | None, picked: Tensor, owned: Tensor, tokens: Tensor,
          shard: Layout, ignore_index: int,
          group: dist.ProcessGroup) -> tuple[Tensor, Tensor | None, Tensor]:
    """Combine per-shard (lse, entropy, logp of the owned token) into global values.

    With e_r = exp(lse_r - m) for m the global max of the lse_r and s = sum_r e_r:
    lse = m + log s, logp = (logp_r + log e_r on the owning rank) - log s, and
    entropy = sum_r e_r (H_r - log e_r) / s + log s. Every term is bounded, so no
    cancellation between large logits occurs.
    """
    top = torch.where(torch.isnan(lse), torch.inf, lse)
    dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
    shift = torch.where(torch.isfinite(top), top, 0.0)
    log_e = lse - shift
    e = log_e.exp()
    stats = torch.zeros(3, lse.shape[0], dtype=torch.float32, device=lse.device)
    stats[0] = e
    owned_term = torch.where(lse == -torch.inf, -torch.inf, picked + log_e)
    stats[1] = torch.where(owned, owned_term, 0.0)
    if entropy is not None:
        stats[2] = torch.where(e > 0, e * (entropy - log_e), 0.0)
    dist.all_reduce(stats, op=dist.ReduceOp.SUM, group=group)
    log_s = stats[0].log()
    total_lse = torch.where(top == torch.inf, torch.nan, shift + log_s)
    finite = torch.isfinite(total_lse)
    valid = (tokens >= 0) & (tokens < shard.total) & finite
    ignored = tokens == ignore_index
    logp = torch.where(valid, stats[1] - log_s, torch.nan).masked_fill(ignored, 0.0)
    merged_entropy = None
    if entropy is not None:
        merged = torch.where(finite, stats[2] / stats[0] + log_s, torch.nan)
        merged_entropy = merged.masked_fill(ignored, 0.0)
    return logp, merged_entropy, total_lse


def padded(logits: Tensor) -> Tensor:
    """A copy of `logits` with one extra column of -inf (see `backward_tokens`)."""
    out = logits.new_empty(logits.shape[0], logits.shape[1] + 1)
    out[:, :-1] = logits
    out[:, -1] = -torch.inf
    return out


# ---------------------------------------------------------------------------
# logits already sharded by vocabulary


def _logp_args(logits: Tensor, tokens: Tensor, temperature: Temperature,
               with_entropy: bool) -> dict[str, Any]:
    return {"logits": logits, "tokens": tokens, "temperature": temperature,
            "ignore_index": KERNEL_IGNORE, "rows": None, "out": None,
            "with_entropy": with_entropy}


def _logp_kernel(args: Mapping[str, Any]) -> Any:
    from rlk.ops.logp import LOGP, LOGP_ENTROPY

    return (LOGP_ENTROPY if args["with_entropy"] else LOGP).kernel(args)


def sharded_forward(logits: Tensor, tokens: Tensor, temperature: Temperature, ignore_index: int,
                    group: dist.ProcessGroup,
                    with_entropy: bool) -> tuple[Tensor, Tensor | None, Tensor]:
    """Global (logp, entropy, lse) from this rank's [N, V_local] logits, via the logp kernel."""
    shard = layout(logits.shape[1], group, logits.device)
    local, owned = forward_tokens(tokens, shard)
    args = _logp_args(logits, local, temperature, with_entropy)
    picked, entropy, lse = _logp_kernel(args).forward(**args)
    return merge(lse, entropy, picked, owned, tokens, shard, ignore_index, group)


def sharded_backward(grad_logp: Tensor, grad_entropy: Tensor | None, logits: Tensor,
                     tokens: Tensor, temperature: Temperature, ignore_index: int,
                     group: dist.ProcessGroup, lse: Tensor, entropy: Tensor | None) -> Tensor:
    """This rank's slice of the logits gradient, one row chunk of padded logits at a time."""
    from rlk.native.chunks import rows_per_chunk

    shard = layout(logits.shape[1], group, logits.device)
    codes = backward_tokens(tokens, shard, ignore_index)
    grad = torch.empty_like(logits)
    step = rows_per_chunk(logits.shape[1] + 1, 4)
    kernel = None
    for start in range(0, logits.shape[0], step):
        stop = min(start + step, logits.shape[0])
        temp = temperature[start:stop] if isinstance(temperature, Tensor) else temperature
        chunk = padded(logits[start:stop])
        args = _logp_args(chunk, codes[start:stop], temp, entropy is not None)
        kernel = kernel or _logp_kernel(args)
        chunk_grad = kernel.backward(
            grad_logp[start:stop],
            None if grad_entropy is None else grad_entropy[start:stop],
            chunk, codes[start:stop], temp, KERNEL_IGNORE, None, lse[start:stop],
            None if entropy is None else entropy[start:stop], True,
        )
        grad[start:stop] = chunk_grad[:, :-1]
    return grad


@torch.library.custom_op("rlk::sharded_logp", mutates_args=())
def _sharded_op(logits: Tensor, tokens: Tensor, temperature: Tensor | None,
                temperature_value: float, ignore_index: int, group: str,
                with_entropy: bool) -> tuple[Tensor, Tensor, Tensor]:
    temp = temperature_value if temperature is None else temperature
    process_group = resolve(group)
    assert process_group is not None
    logp, entropy, lse = sharded_forward(logits, tokens, temp, ignore_index, process_group,
                                         with_entropy)
    return logp, (torch.zeros_like(logp) if entropy is None else entropy), lse


@torch.library.custom_op("rlk::sharded_logp_backward", mutates_args=())
def _sharded_backward_op(grad_logp: Tensor, grad_entropy: Tensor | None, logits: Tensor,
                         tokens: Tensor, temperature: Tensor | None, temperature_value: float,
                         ignore_index: int, group: str, lse: Tensor,
                         entropy: Tensor | None) -> Tensor:
    temp = temperature_value if temperature is None else temperature
    process_group = resolve(group)
    assert process_group is not None
    return sharded_backward(grad_logp.contiguous(),
                            None if grad_entropy is None else grad_entropy.contiguous(),
                            logits, tokens, temp, ignore_index, process_group, lse, entropy)


@_sharded_op.register_fake
def _(logits, tokens, temperature, temperature_value, ignore_index, group, with_entropy):
    # the merged lse is float64 as the logp kernels' is (docs/backends/writing-a-backend.md)
    return (*(logits.new_empty(logits.shape[0], dtype=torch.float32) for _ in range(2)),
            logits.new_empty(logits.shape[0], dtype=torch.float64))


@_sharded_backward_op.register_fake
def _(grad_logp, grad_entropy, logits, tokens, temperature, temperature_value, ignore_index,
      group, lse, entropy):
    return torch.empty_like(logits)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
    logits, tokens, temperature, temperature_value, ignore_index, group, with_entropy = inputs
    ctx.save_for_backward(logits, tokens, temperature, output[2],
                          output[1] if with_entropy else None)
    ctx.options = (temperature_value, ignore_index, group, with_entropy)


def _grad(ctx: Any, grad_logp: Tensor, grad_entropy: Tensor,
          grad_lse: Tensor) -> tuple[Tensor | None, ...]:
    logits, tokens, temperature, lse, entropy = ctx.saved_tensors
    temperature_value, ignore_index, group, with_entropy = ctx.options
    grad = _sharded_backward_op(grad_logp, grad_entropy if with_entropy else None, logits,
                                tokens, temperature, temperature_value, ignore_index, group,
                                lse, entropy)
    return grad, None, None, None, None, None, None


register_autograd(_sharded_op, _grad, _setup)


def _prepare(logits: Tensor, tokens: Tensor, group: Any, temperature: Temperature,
             ignore_index: int) -> tuple[Tensor, Tensor, Tensor | None, float, str]:
    """Validated, flattened arguments of the sharded entry points."""
    if group is None:
        raise TypeError("group is required: the process group the vocabulary is sharded over")
    name = group_name(group)
    validate.tensor("logits", logits, validate.FLOATS)
    validate.tensor("tokens", tokens, validate.INDICES)
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits must be [..., V_local] with V_local >= 1; "
                         f"got shape {tuple(logits.shape)}")
    lead = tuple(logits.shape[:-1])
    validate.shape("tokens", tokens, lead, " (the leading dimensions of logits)")
    validate.same_device("tokens", tokens, logits, "logits")
    validate.integer("ignore_index", ignore_index)
    flat_tokens = tokens.reshape(-1).to(torch.int64)
    tensor_temp, value = temperatures.split(temperatures.prepare(temperature, lead, logits,
                                                                 "logits"))
    if config.checking_inputs():
        total = layout(logits.shape[-1], group, logits.device).total
        check_tokens(flat_tokens, total, ignore_index)
    return logits.reshape(-1, logits.shape[-1]), flat_tokens, tensor_temp, value, name


def _call(logits: Tensor, tokens: Tensor, group: Any, temperature: Temperature,
          ignore_index: int, with_entropy: bool) -> tuple[Tensor, Tensor]:
    flat, flat_tokens, temp, value, name = _prepare(logits, tokens, group, temperature,
                                                   ignore_index)
    result, entropy, _ = _sharded_op(flat, flat_tokens, temp, value, ignore_index, name,
                                     with_entropy)
    return result.view(tokens.shape), entropy.view(tokens.shape)


def logp(logits: Tensor, tokens: Tensor, *, group: dist.ProcessGroup,
         temperature: Temperature = 1.0, ignore_index: int = -100) -> Tensor:
    """`rlk.logp` for logits sharded by vocabulary over `group` (contiguous, in rank order).

    logits `[..., V_local]` on each rank; tokens `[...]` hold global vocabulary ids
    and are the same on every rank; the result (also the same on every rank) equals
    `rlk.logp` on the concatenated logits. Differentiable w.r.t. this rank's logits.
    """
    return _call(logits, tokens, group, temperature, ignore_index, False)[0]


def logp_entropy(logits: Tensor, tokens: Tensor, *, group: dist.ProcessGroup,
                 temperature: Temperature = 1.0,
                 ignore_index: int = -100) -> tuple[Tensor, Tensor]:
    """`logp` plus the entropy of the full (all-shard) softmax, both differentiable."""
    return _call(logits, tokens, group, temperature, ignore_index, True)


def check_tokens(tokens: Tensor, total: int, ignore_index: int) -> None:
    """The opt-in range check of global token ids (RLK_CHECK_INPUTS=1)."""
    bad = ((tokens < 0) | (tokens >= total)) & (tokens != ignore_index)
    validate.first_bad("tokens", bad, tokens,
                       f"[0, {total}) (the vocabulary over the group) and is not "
                       f"ignore_index={ignore_index}")
