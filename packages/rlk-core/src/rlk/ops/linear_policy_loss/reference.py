"""The float64 reference of `linear_policy_loss`.

Float64 ground truth for tests and `rlk-core doctor --smoke` only: it favours clarity over
memory, so never call it on production-sized inputs.
"""

from __future__ import annotations

import torch

from rlk.ops.linear_logp.reference import linear_logp_entropy
from rlk.ops.policy_loss.options import PolicyLossOptions
from rlk.ops.policy_loss.reference import aggregate, policy_loss


def linear_policy_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    tokens: torch.Tensor,
    *,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logp: torch.Tensor | None = None,
    rollout_logp: torch.Tensor | None = None,
    importance_weights: torch.Tensor | None = None,
    options: PolicyLossOptions | None = None,
    bias: torch.Tensor | None = None,
    temperature: float | torch.Tensor = 1.0,
    ignore_index: int = -100,
    softcap: float | None = None,
    logit_scale: float = 1.0,
    entropy_coef: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float64 (loss, metrics, logp) of `policy_loss` on the LM head's log-probabilities.

    hidden [N, H], tokens [N] and a per-row temperature [N]; old_logp, mask [B, T] with
    B * T = N. Positions whose token is ignore_index count as masked. The loss is
    policy_loss's minus entropy_coef times the entropy aggregated as policy_loss aggregates
    its terms; metrics are policy_loss's, then the entropy's mean over the mask; logp is 0
    at masked positions.
    """
    o = options if options is not None else PolicyLossOptions()
    shape = old_logp.shape
    keep = (mask != 0) & (tokens.view(shape) != ignore_index)
    kept_tokens = torch.where(keep.reshape(-1), tokens, ignore_index)
    logp, entropy = linear_logp_entropy(hidden, weight, kept_tokens, bias=bias,
                                        temperature=temperature, ignore_index=ignore_index,
                                        softcap=softcap, logit_scale=logit_scale)
    logp2, entropy2 = logp.view(shape), entropy.view(shape)
    loss, metrics = policy_loss(logp2, old_logp, advantages, keep, ref_logp=ref_logp,
                                rollout_logp=rollout_logp,
                                importance_weights=importance_weights, options=o)
    if entropy_coef != 0.0:
        loss = loss - entropy_coef * aggregate(entropy2, keep, o)
    entropy_mean = entropy2.detach()[keep].sum() / max(int(keep.sum()), 1)
    return loss, torch.cat([metrics, entropy_mean.reshape(1)]), logp
