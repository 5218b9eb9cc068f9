"""Vocabulary-parallel shard math: where a rank's slice of the vocabulary sits, token codes
local to a slice, and the merge of per-slice softmax statistics into global ones.

A leaf module: the distributed ops (`rlk.distributed`, `linear_logp(group=)`), the native
kernels and backends (through `rlk.backend`) use it, and it imports no op. Each rank
holds a contiguous slice of the vocabulary, in rank order (slice sizes may differ); one
all-gather of the sizes gives the layout, two collectives merge the statistics (a MAX,
then one SUM of three numbers per row), so no rank ever holds the whole vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from rlk._runtime import validate

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


def resolve_group(name: str) -> dist.ProcessGroup | None:
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


def check_tokens(tokens: Tensor, total: int, ignore_index: int) -> None:
    """The opt-in range check of global token ids (RLK_CHECK_INPUTS=1)."""
    bad = ((tokens < 0) | (tokens >= total)) & (tokens != ignore_index)
    validate.first_bad("tokens", bad, tokens,
                       f"[0, {total}) (the vocabulary over the group) and is not "
                       f"ignore_index={ignore_index}")
