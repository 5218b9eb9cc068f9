"""entropy kernels in plain torch, float64 arithmetic (plugin API 2.1)."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _scaled(logits: Tensor, temperature, rows: Tensor | None):
    """The computed rows in float64 divided by T, T, which rows exist, and where they are."""
    if rows is None:
        exists = torch.ones(logits.shape[0], dtype=torch.bool)
        pick: Tensor = torch.arange(logits.shape[0])
    else:
        exists = (rows >= 0) & (rows < logits.shape[0])
        pick = torch.where(exists, rows, 0)
    t = temperature[pick].double().unsqueeze(1) if isinstance(temperature, Tensor) \
        else temperature
    return logits[pick].double() / t, t, exists, pick


def _counted(mask: Tensor | None, pick: Tensor) -> Tensor:
    return torch.ones(pick.shape, dtype=torch.bool) if mask is None else mask[pick]


def forward(logits, temperature, mask, rows, out):
    x, _, exists, pick = _scaled(logits, temperature, rows)
    lse = torch.logsumexp(x, dim=1).masked_fill(~exists, math.nan)
    log_probs = x - lse.unsqueeze(1)
    p = log_probs.exp()
    h = -torch.where(p > 0, p * log_probs, 0.0).sum(dim=1)
    h = torch.where(torch.isfinite(lse), h, math.nan)
    h = h.masked_fill(exists & ~_counted(mask, pick), 0.0)
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    entropy = h.to(dtype)
    if out is not None:
        entropy = out.copy_(entropy)
    return entropy, lse


def backward(grad_entropy, logits, temperature, mask, rows, lse, entropy, inplace):
    x, t, exists, pick = _scaled(logits, temperature, rows)
    log_probs = torch.log_softmax(x, dim=1)
    p = log_probs.exp()
    h = -torch.where(p > 0, p * log_probs, 0.0).sum(dim=1, keepdim=True)
    grad = -torch.where(p > 0, p * (log_probs + h), 0.0) * grad_entropy.double().unsqueeze(1)
    grad = grad / t
    grad[~exists | ~_counted(mask, pick)] = 0.0
    result = torch.zeros(logits.shape, dtype=torch.float64)
    result.index_add_(0, pick, grad)
    result = result.to(logits.dtype)
    return logits.copy_(result) if inplace else result
