"""`entropy` kernels: the logp kernels with token codes that ask for the entropy only (no
logp; a masked row is skipped)."""

from __future__ import annotations

import torch
from rlk.backend import Temperature
from torch import Tensor

from . import logp
from ._launch import f32_empty


def _entropy_tokens(logits: Tensor, mask: Tensor | None) -> tuple[Tensor | None, int]:
    """Token codes for the logp kernels' entropy-only use, and the ignore_index they use:
    none without a mask (statistics only), else 0 where a row counts and -1 where masked
    (skipped: zero entropy and gradient, the row never read)."""
    if mask is None:
        return None, -1
    return torch.where(mask, 0, -1), -1


def forward(
    logits: Tensor, temperature: Temperature, mask: Tensor | None, rows: Tensor | None,
    out: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """Entropy of softmax(logits / T) per row through the forward kernel, without logp."""
    count = logits.shape[0] if rows is None else rows.shape[0]
    device = logits.device
    entropy = f32_empty(count, device=device) if out is None else out
    lse = torch.empty(count, dtype=torch.float64, device=device)
    if count > 0:
        tokens, skip = _entropy_tokens(logits, mask)
        logp.launch_forward(logits, tokens, temperature, skip, rows, None, entropy, lse)
    return entropy, lse


def backward(
    grad_entropy: Tensor, logits: Tensor, temperature: Temperature, mask: Tensor | None,
    rows: Tensor | None, lse: Tensor, entropy: Tensor, inplace: bool,
) -> Tensor:
    """Gradient of sum(grad_entropy * entropy) w.r.t. logits, through the logp backward."""
    tokens, skip = _entropy_tokens(logits, mask)
    if tokens is None:
        tokens = torch.zeros(logits.shape[0], dtype=torch.int64, device=logits.device)
    no_logp = torch.zeros_like(grad_entropy, dtype=torch.float32)
    return logp.backward(no_logp, grad_entropy, logits, tokens, temperature, skip, rows, lse,
                         entropy, inplace)
