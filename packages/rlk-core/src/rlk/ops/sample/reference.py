"""The float64 reference of `sample`: the distribution it draws from.

Float64 ground truth for tests and `rlk-core doctor --smoke` only: it favours clarity over
memory, so never call it on production-sized inputs.
"""

from __future__ import annotations

import torch


def sample_log_probs(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
) -> torch.Tensor:
    """Float64 log-probabilities [B, V] of the distribution `sample` draws from.

    Filters in order: temperature, top-k (ties with the k-th value kept), top-p (the
    smallest prefix, in descending order, whose mass reaches top_p; ties with its
    last token kept), min-p (p >= min_p * max p). -inf outside the kept set; rows
    without a valid token (NaN, +inf, all -inf) are NaN. Temperature 0 is a point
    mass on the first most likely token; any temperature > 0 splits the mass among
    tokens tied at the max.
    """
    x = logits.detach().to(torch.float64)
    rows, vocab = x.shape
    out = torch.full_like(x, -torch.inf)
    for row in range(rows):
        values = x[row]
        if not bool(torch.isfinite(torch.logsumexp(values, dim=0))):
            out[row] = torch.nan
            continue
        if temperature == 0.0:
            out[row, int(values.argmax())] = 0.0
            continue
        # shifted by the max first: at a tiny temperature x / T is so large that the log of
        # the tied top tokens' count vanishes in its rounding (ties at the max share the
        # mass for every T > 0: -log(count), not greedy's 0)
        values = (values - values.max()) / temperature
        keep = torch.ones(vocab, dtype=torch.bool, device=values.device)
        if 0 < top_k < vocab:
            keep &= values >= values.sort(descending=True).values[top_k - 1]
        if top_p < 1.0:
            probs = torch.where(keep, values, -torch.inf).softmax(dim=0)
            ordered = probs.sort(descending=True).values
            ahead = torch.cat([ordered.new_zeros(1), ordered.cumsum(0)[:-1]])
            last = int((ahead < top_p).sum()) - 1
            keep &= probs >= ordered[max(last, 0)]
        if min_p > 0.0:
            probs = values.softmax(dim=0)
            keep &= probs >= min_p * probs.max()
        kept = torch.where(keep, values, -torch.inf)
        out[row] = kept - torch.logsumexp(kept, dim=0)
    return out
