"""One token per row from non-negative weights by the inverse CDF (`pick`), in two levels
over a whole vocabulary (`draw`).

A row's weights are summed in chunks of CHUNK entries (the only full read of the weights);
the first uniform picks a chunk by those sums, the second a token inside it. Both levels
compare integer (fixed-point) cumulative sums, so the pick is exact: an entry of weight zero
is never drawn, whatever the rounding of the float sums, and every entry of positive weight
keeps its share to within 2**-40 of the row's total.
"""

from __future__ import annotations

import torch
from torch import Tensor

CHUNK = 1024
_UNITS = 2.0**40


def pick(weights: Tensor, u: Tensor) -> Tensor:
    """Per row of `weights` [R, n] (each with a positive entry): the index whose cumulative
    interval holds u * total, for u [R] in [0, 1)."""
    total = weights.sum(-1, keepdim=True, dtype=torch.float64)
    share = (weights.double() / total * _UNITS).ceil().clamp_min(1.0)
    units = torch.where(weights > 0, share, 0.0).to(torch.int64)
    cumulative = units.cumsum(-1)
    last = cumulative[:, -1]
    target = torch.minimum((u * last.double()).floor().to(torch.int64), last - 1)
    return torch.searchsorted(cumulative, target[:, None], right=True)[:, 0]


def draw(weights: Tensor, uniforms: Tensor) -> tuple[Tensor, Tensor]:
    """(token int64 [R], total weight float64 [R]) for weights [R, V] and uniforms [R, 2]."""
    rows, vocab = weights.shape
    whole = vocab // CHUNK * CHUNK
    sums = [weights[:, :whole].reshape(rows, -1, CHUNK).sum(-1, dtype=torch.float64)]
    if whole < vocab:
        sums.append(weights[:, whole:].sum(-1, keepdim=True, dtype=torch.float64))
    chunk_sums = torch.cat(sums, dim=1)
    chunk = pick(chunk_sums, uniforms[:, 0])
    columns = chunk[:, None] * CHUNK + torch.arange(CHUNK, device=weights.device)
    inside = columns < vocab
    part = weights.gather(1, columns.clamp_max(vocab - 1)).masked_fill(~inside, 0.0)
    token = chunk * CHUNK + pick(part, uniforms[:, 1])
    return token, chunk_sums.sum(-1)
