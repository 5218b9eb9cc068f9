"""The native `entropy` kernels: logp's native kernels with tokens that ask for the entropy
only (each row's logp is dropped; masked rows are ignored rows)."""

from __future__ import annotations

import torch
from torch import Tensor

from rlk._runtime.temperature import Temperature
from rlk.ops.logp import native as logp_native


def _entropy_tokens(logits: Tensor, mask: Tensor | None) -> Tensor:
    """Token codes that make the logp kernels compute entropy only: 0 (a valid token,
    whose logp is dropped) where a row counts, `_SKIP` (the ignore_index) where masked."""
    if mask is None:
        return torch.zeros(logits.shape[0], dtype=torch.int64, device=logits.device)
    return torch.where(mask, 0, _SKIP)


_SKIP = -1


def forward(logits: Tensor, temperature: Temperature, mask: Tensor | None, rows: Tensor | None,
            out: Tensor | None) -> tuple[Tensor, Tensor]:
    """Entropy of softmax(logits / T) per row (0 where `mask` is False) and the lse."""
    tokens = _entropy_tokens(logits, mask)
    _, entropy, lse = logp_native.forward(logits, tokens, temperature, _SKIP, rows, None, True)
    assert entropy is not None
    if out is not None:
        out.copy_(entropy)
        return out, lse
    return entropy, lse


def backward(grad_entropy: Tensor, logits: Tensor, temperature: Temperature, mask: Tensor | None,
             rows: Tensor | None, lse: Tensor, entropy: Tensor, inplace: bool) -> Tensor:
    tokens = _entropy_tokens(logits, mask)
    no_logp = torch.zeros_like(grad_entropy)
    return logp_native.backward(no_logp, grad_entropy, logits, tokens, temperature, _SKIP, rows,
                                lse, entropy, inplace)
