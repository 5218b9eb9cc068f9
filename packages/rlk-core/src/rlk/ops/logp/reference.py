"""The float64 reference of `logp` and `logp_entropy`, and its gradient.

Float64 ground truth for tests and `rlk-core doctor --smoke` only: it favours clarity over
memory, so never call it on production-sized inputs.
"""

from __future__ import annotations

import torch


def logp_entropy(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    *,
    temperature: float | torch.Tensor = 1.0,
    ignore_index: int = -100,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax(logits / T) at `tokens`, and the entropy of softmax(logits / T), in float64.

    `tokens` has the leading shape of `logits` (one token per row) or that shape plus K
    (K tokens per row, logp `[..., K]`); a per-row temperature has the leading shape.
    An ignored token (ignore_index) gives logp 0, and a row whose tokens are all ignored
    gives entropy 0; an out-of-range token gives NaN logp; non-finite rows give NaN.
    """
    x = logits.to(torch.float64)
    if isinstance(temperature, torch.Tensor):
        x = x / temperature.detach().to(torch.float64).unsqueeze(-1)
    else:
        x = x / float(temperature)
    vocab = x.shape[-1]
    lse = torch.logsumexp(x, dim=-1)
    log_probs = x - lse.unsqueeze(-1)
    probs = log_probs.exp()
    # p log p is 0 where p is 0; masking log p (not the product) keeps gradients finite
    entropy = -(probs * torch.where(probs > 0, log_probs, 0.0)).sum(dim=-1)
    tokens = tokens.detach().to(torch.int64)
    per_row = tokens.dim() == x.dim()
    columns = tokens if per_row else tokens.unsqueeze(-1)
    valid = (columns >= 0) & (columns < vocab)
    picked = log_probs.gather(-1, columns.clamp(0, max(vocab - 1, 0)))
    finite = torch.isfinite(lse)
    logp = torch.where(valid & finite.unsqueeze(-1), picked, torch.nan)
    entropy = torch.where(finite, entropy, torch.nan)
    ignored = columns == ignore_index
    logp = logp.masked_fill(ignored, 0.0)
    entropy = entropy.masked_fill(ignored.all(dim=-1), 0.0)
    return (logp if per_row else logp.squeeze(-1)), entropy


def logp_entropy_grad(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    grad_logp: torch.Tensor,
    grad_entropy: torch.Tensor | None,
    *,
    temperature: float | torch.Tensor = 1.0,
    ignore_index: int = -100,
) -> torch.Tensor:
    """The float64 gradient of sum(grad_logp * logp + grad_entropy * entropy) w.r.t. logits.

    Computed by autograd over the float64 reference, for finite rows with valid tokens.
    """
    x = logits.detach().to(torch.float64).requires_grad_(True)  # never the caller's tensor
    logp, entropy = logp_entropy(x, tokens, temperature=temperature, ignore_index=ignore_index)
    total = (logp * grad_logp.to(torch.float64)).sum()
    if grad_entropy is not None:
        total = total + (entropy * grad_entropy.to(torch.float64)).sum()
    (grad,) = torch.autograd.grad(total, x)
    return grad
