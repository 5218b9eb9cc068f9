"""The float64 reference of `linear_logp` and `linear_logp_entropy`, and their gradients.

Float64 ground truth for tests and `rlk-core doctor --smoke` only: it favours clarity over
memory, so never call it on production-sized inputs.
"""

from __future__ import annotations

import torch

from rlk.ops.logp.reference import logp_entropy


def lm_head_logits(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    softcap: float | None = None,
    logit_scale: float = 1.0,
) -> torch.Tensor:
    """Float64 logits of an LM head: softcap * tanh(logit_scale * (hidden @ weight.T + bias)
    / softcap), the scale first (Cohere's logit_scale), then the soft cap (Gemma's
    final_logit_softcapping), as TRL's ChunkedLogProbFunction applies them."""
    logits = hidden.to(torch.float64) @ weight.to(torch.float64).t()
    if bias is not None:
        logits = logits + bias.to(torch.float64)
    logits = logits * logit_scale
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return logits


def linear_logp_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    tokens: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float | torch.Tensor = 1.0,
    ignore_index: int = -100,
    softcap: float | None = None,
    logit_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`logp_entropy` of the float64 `lm_head_logits`."""
    logits = lm_head_logits(hidden, weight, bias=bias, softcap=softcap, logit_scale=logit_scale)
    return logp_entropy(logits, tokens, temperature=temperature, ignore_index=ignore_index)


def linear_logp_entropy_grad(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    tokens: torch.Tensor,
    grad_logp: torch.Tensor,
    grad_entropy: torch.Tensor | None,
    *,
    bias: torch.Tensor | None = None,
    temperature: float | torch.Tensor = 1.0,
    ignore_index: int = -100,
    softcap: float | None = None,
    logit_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Float64 gradients of sum(grad_logp * logp + grad_entropy * entropy) w.r.t.
    (hidden, weight, bias); the bias gradient is None without a bias."""
    hidden64, weight64 = (t.detach().to(torch.float64).requires_grad_(True)
                          for t in (hidden, weight))
    bias64 = None if bias is None else bias.detach().to(torch.float64).requires_grad_(True)
    logp, entropy = linear_logp_entropy(hidden64, weight64, tokens, bias=bias64,
                                        temperature=temperature, ignore_index=ignore_index,
                                        softcap=softcap, logit_scale=logit_scale)
    total = (logp * grad_logp.to(torch.float64)).sum()
    if grad_entropy is not None:
        total = total + (entropy * grad_entropy.to(torch.float64)).sum()
    inputs = [hidden64, weight64] + ([] if bias64 is None else [bias64])
    grads = torch.autograd.grad(total, inputs, allow_unused=True)
    zero = [torch.zeros_like(x) if g is None else g for g, x in zip(grads, inputs, strict=True)]
    return zero[0], zero[1], (zero[2] if bias64 is not None else None)
