"""Rows whose kept set lies among their K largest logits: filters and draw in float64 there.

FlashInfer's radix top-k gives each row its K largest logits, K set by top_k and V alone.
When every token the filters keep is among them (checked per row: the smallest of the K lies
strictly below the cut that bounds the kept set), the filters, the draw and processed_logp
need nothing else, and cost one read of the logits instead of FlashInfer's softmax and its
renormalisations over the whole vocabulary. A top-k cut bounds the set whenever its ties fit
among the K; with top_k off, a top-p nucleus or a min-p floor reached among the K does (a
min-p floor also does under top-k when top-p is off: top-p is relative to the top-k set's
mass, which needs that whole set).
Rows whose kept set may reach past the K take the full-vocabulary path; which path a row
takes depends only on its logits, so its token never depends on the batch.

The pick runs over the kept tokens in vocabulary order, so that the order in which the
radix top-k returns tied logits does not matter.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rlk_flashinfer.draw import pick

MIN_SIZE = 1024  # shortlist for top-p and min-p without top-k
TIE_ROOM = 64  # shortlist entries beyond top_k, for ties at the k-th logit
MAX_TOP_K = 4096  # above this, every row takes the full-vocabulary path


def size(vocab: int, top_k: int, top_p: float, min_p: float) -> int | None:
    """Shortlist length for these filters, or None when no filter can bound the kept set."""
    if top_k > MAX_TOP_K or (top_k == 0 and top_p == 1.0 and min_p == 0.0):
        return None
    return min(vocab, max(MIN_SIZE, top_k + TIE_ROOM))


def sample(values: Tensor, indices: Tensor, vocab: int, temperature: float, top_k: int,
           top_p: float, min_p: float, log_mass: Tensor | None,
           u: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(fits bool [R], token int64 [R], processed_logp float64 [R]) from each row's shortlist:
    `values` [R, K] sorted in descending order, `indices` their vocabulary positions.
    `log_mass`: log of the softmax mass relative to the row's largest logit, [R, 1], needed
    for top-p when top_k is off (the nucleus is relative to the whole vocabulary). Rows
    that do not fit get meaningless tokens and values."""
    scaled = values.double() / temperature
    top = scaled[:, :1]
    weight = (scaled - top).exp()
    smallest = scaled[:, -1]
    fits = torch.full_like(smallest, scaled.shape[1] == vocab, dtype=torch.bool)
    keep = torch.ones_like(scaled, dtype=torch.bool)
    if top_k > 0:
        kth = scaled[:, top_k - 1:top_k]
        keep &= scaled >= kth
        fits |= smallest < kth[:, 0]
    if top_p < 1.0:
        kept = torch.where(keep, weight, 0.0)
        if top_k > 0:
            mass = kept.sum(-1, keepdim=True)
        elif log_mass is not None:
            mass = log_mass.exp()
        else:
            raise ValueError("top-p without top-k needs log_mass, the whole softmax's mass")
        reached = kept.cumsum(-1) >= top_p * mass
        found = reached.any(-1)
        cut = scaled.gather(1, reached.to(torch.int8).argmax(-1, keepdim=True))
        keep &= (scaled >= cut) | ~found[:, None]  # not found: the nucleus holds all K
        if top_k == 0:
            fits |= found & (smallest < cut[:, 0])
    if min_p > 0.0:
        floor = top + math.log(min_p)
        keep &= scaled >= floor
        if top_k == 0 or top_p == 1.0:  # else top-p needs the whole top-k set's mass
            fits |= smallest < floor[:, 0]
    kept = torch.where(keep, weight, 0.0)
    order = indices.argsort(-1)
    kept, indices = kept.gather(1, order), indices.gather(1, order)
    position = pick(kept, u)[:, None]
    processed = kept.gather(1, position).log()[:, 0] - kept.sum(-1).log()
    return fits, indices.gather(1, position)[:, 0], processed
