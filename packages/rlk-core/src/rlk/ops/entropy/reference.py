"""The float64 reference of `entropy`.

Float64 ground truth for tests and `rlk-core doctor --smoke` only: it favours clarity over
memory, so never call it on production-sized inputs.
"""

from __future__ import annotations

import torch

from rlk.ops.logp.reference import logp_entropy


def entropy(
    logits: torch.Tensor,
    *,
    temperature: float | torch.Tensor = 1.0,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The float64 entropy of softmax(logits / T) per row; 0 where `mask` is False."""
    lead = logits.shape[:-1]
    tokens = torch.zeros(lead, dtype=torch.int64, device=logits.device)
    if mask is not None:
        tokens = tokens.masked_fill(~mask.to(torch.bool), -1)
    return logp_entropy(logits, tokens, temperature=temperature, ignore_index=-1)[1]
