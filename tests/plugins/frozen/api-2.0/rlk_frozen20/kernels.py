"""logp / logp_entropy kernels in plain torch, float64 arithmetic (plugin API 2.0)."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _rows(logits: Tensor, tokens: Tensor, temperature, rows: Tensor | None):
    """The computed rows in float64 divided by T, their tokens, and which row indices exist."""
    if rows is None:
        exists = torch.ones(logits.shape[0], dtype=torch.bool)
        pick: Tensor | slice = slice(None)
    else:
        exists = (rows >= 0) & (rows < logits.shape[0])
        pick = torch.where(exists, rows, 0)
    x = logits[pick].double()
    t = temperature[pick].double().unsqueeze(1) if isinstance(temperature, Tensor) \
        else temperature
    return x / t, tokens[pick], t, exists


def forward(logits, tokens, temperature, ignore_index, rows, out, with_entropy):
    x, tok, _, exists = _rows(logits, tokens, temperature, rows)
    lse = torch.logsumexp(x, dim=1).masked_fill(~exists, math.nan)
    log_probs = x - lse.unsqueeze(1)
    inside = (tok >= 0) & (tok < x.shape[1])
    picked = log_probs.gather(1, torch.where(inside, tok, 0).unsqueeze(1)).squeeze(1)
    ignored = tok == ignore_index
    finite = torch.isfinite(lse)
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    logp = torch.where(inside & finite, picked, math.nan).masked_fill(ignored, 0.0).to(dtype)
    entropy = None
    if with_entropy:
        p = log_probs.exp()
        h = -torch.where(p > 0, p * log_probs, 0.0).sum(dim=1)
        entropy = torch.where(finite, h, math.nan).masked_fill(ignored, 0.0).to(dtype)
    if out is not None:
        logp = out.copy_(logp)
    return logp, entropy, lse


def backward(grad_logp, grad_entropy, logits, tokens, temperature, ignore_index, rows, lse,
             entropy, inplace):
    x, tok, t, exists = _rows(logits, tokens, temperature, rows)
    log_probs = torch.log_softmax(x, dim=1)
    p = log_probs.exp()
    g = grad_logp.double().unsqueeze(1)
    grad = -p * g
    inside = (tok >= 0) & (tok < x.shape[1])
    grad.scatter_add_(1, torch.where(inside, tok, 0).unsqueeze(1),
                      torch.where(inside.unsqueeze(1), g, 0.0))
    if grad_entropy is not None:
        h = -torch.where(p > 0, p * log_probs, 0.0).sum(dim=1, keepdim=True)
        grad -= torch.where(p > 0, p * (log_probs + h), 0.0) * grad_entropy.double().unsqueeze(1)
    grad = grad / t
    grad[~inside] = math.nan
    grad[(tok == ignore_index) | ~exists] = 0.0
    result = torch.zeros(logits.shape, dtype=torch.float64)
    if rows is None:
        result.copy_(grad)
    else:
        result.index_add_(0, torch.where(exists, rows, 0), grad)
    result = result.to(logits.dtype)
    return logits.copy_(result) if inplace else result
