"""float64 references for the GPU tests (independent of the kernels and of rlk's native code)."""

from __future__ import annotations

import torch
from torch import Tensor


def logp_entropy(
    logits: Tensor, tokens: Tensor, temperature: float | Tensor, ignore_index: int
) -> tuple[Tensor, Tensor]:
    """float64 logp and entropy per row, with the backend contract's special cases."""
    x = logits.double()
    t = temperature.double().unsqueeze(1) if isinstance(temperature, Tensor) else temperature
    x = x / t
    logsm = torch.log_softmax(x, dim=1)
    vocab = x.shape[1]
    valid = (tokens >= 0) & (tokens < vocab)
    picked = logsm.gather(1, torch.where(valid, tokens, 0).unsqueeze(1)).squeeze(1)
    picked = torch.where(valid, picked, torch.nan)
    p = logsm.exp()
    ent = -(p * logsm.masked_fill(p == 0, 0.0)).sum(1)
    ignored = tokens == ignore_index
    return picked.masked_fill(ignored, 0.0), ent.masked_fill(ignored, 0.0)


def logp_entropy_grad(
    logits: Tensor,
    tokens: Tensor,
    temperature: float | Tensor,
    ignore_index: int,
    g_logp: Tensor,
    g_ent: Tensor | None,
) -> Tensor:
    """float64 gradient of sum(g_logp * logp + g_ent * entropy) w.r.t. logits, by autograd."""
    x = logits.detach().double().requires_grad_(True)
    lp, ent = logp_entropy(x, tokens, temperature, ignore_index)
    total = (lp.nan_to_num(0.0) * g_logp.double()).sum()
    if g_ent is not None:
        total = total + (ent * g_ent.double()).sum()
    (grad,) = torch.autograd.grad(total, x)
    return grad


def truncated_log_probs(
    logits: Tensor, temperature: float, top_k: int, top_p: float, min_p: float
) -> Tensor:
    """float64 log-probabilities of the filtered, renormalised distribution (-inf = removed).

    Filters keep a prefix of the sorted row with ties at the boundary kept: top-k keeps values
    >= the k-th largest; top-p keeps the shortest prefix whose mass (relative to the top-k set)
    reaches top_p; min-p keeps p >= min_p * p_max.
    """
    x = logits.double() / temperature
    rows = []
    for row in x:
        keep = torch.ones_like(row, dtype=torch.bool)
        if top_k > 0:
            kth = row.topk(min(top_k, row.numel())).values[-1]
            keep &= row >= kth
        if top_p < 1.0:
            masked = row.masked_fill(~keep, -torch.inf)
            p = torch.softmax(masked, 0)
            order = torch.sort(masked, descending=True, stable=True)
            cum = p[order.indices].cumsum(0)
            first = int(torch.nonzero(cum >= top_p * cum[-1])[0])
            keep &= row >= order.values[first]
        if min_p > 0.0:
            p = torch.softmax(row, 0)
            keep &= p >= min_p * p.max()
        rows.append(torch.log_softmax(row.masked_fill(~keep, -torch.inf), 0))
    return torch.stack(rows)
