"""Native policy_loss: the clipped surrogate, its KL and TIS terms, and an analytic backward.

The loss is a weighted sum of per-token terms, loss = sum(c * term), where the
weights c depend only on the mask and the aggregation mode. The backward is
written out rather than taken through autograd, so kernels never see autograd.
Masked-out positions never reach the result (NaN there is harmless).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class _Terms:
    active: Tensor  # bool [B, T]
    weights: Tensor  # c [B, T]
    ratio: Tensor  # per-token ratio (the sequence ratio broadcast for GSPO)
    slope: Tensor  # d(clipped surrogate)/d(log ratio), 0 where clipping stops the gradient
    surrogate: Tensor  # clipped surrogate per token, times the TIS weight
    tis: Tensor | None  # the (truncated) importance weight
    truncated: Tensor | None  # bool: the TIS weight hit its cap
    clipped: Tensor  # bool: the clipped branch was taken (PPO clip fraction)
    kl: Tensor | None
    kl_slope: Tensor | None  # d kl / d logp
    lengths: Tensor  # tokens per sequence


def _aggregation_weights(mask: Tensor, agg: str) -> tuple[Tensor, Tensor]:
    lengths = mask.sum(dim=1)
    if agg == "token-mean":
        return mask / mask.sum().clamp(min=1.0), lengths
    sequences = (lengths > 0).sum().clamp(min=1).to(mask.dtype)
    if agg == "seq-mean-token-mean":
        per_token = torch.where(lengths > 0, 1.0 / lengths.clamp(min=1e-30), 0.0)
        return mask * per_token.unsqueeze(1) / sequences, lengths
    if agg == "seq-mean-token-sum":
        return mask / sequences, lengths
    # seq-mean-token-sum-norm (Dr. GRPO): a constant divisor, B * T
    return mask / max(mask.numel(), 1), lengths


def _kl(delta: Tensor, estimator: str) -> tuple[Tensor, Tensor]:
    """The KL estimate from delta = logp - ref_logp, and its derivative w.r.t. logp."""
    if estimator == "k1":
        return delta, torch.ones_like(delta)
    if estimator == "k2":
        return 0.5 * delta * delta, delta
    back = torch.exp(-delta)
    return back - 1.0 + delta, 1.0 - back


def _terms(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
           ref_logp: Tensor | None, rollout_logp: Tensor | None, *, clip_low: float,
           clip_high: float, dual_clip: float | None, kl_estimator: str, ratio_level: str,
           agg: str, tis_cap: float | None) -> _Terms:
    active = mask != 0
    weights, lengths = _aggregation_weights(mask, agg)
    log_ratio = torch.where(active, logp - old_logp, 0.0)
    if ratio_level == "sequence":
        per_seq = (log_ratio * mask).sum(dim=1) / lengths.clamp(min=1e-30)
        log_ratio = torch.where(active, per_seq.unsqueeze(1), 0.0)
    ratio = log_ratio.exp()
    adv = advantages if advantages.dim() == 2 else advantages.unsqueeze(1)
    adv = torch.where(active, adv, 0.0)
    plain = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    surrogate = torch.maximum(plain, clipped)
    flows = plain >= clipped
    if dual_clip is not None:
        floor = -adv * dual_clip
        dual = (adv < 0) & (floor < surrogate)
        surrogate = torch.where(dual, floor, surrogate)
        flows = flows & ~dual
    slope = torch.where(flows, plain, 0.0)
    tis = truncated = None
    if rollout_logp is not None:
        tis = torch.where(active, old_logp - rollout_logp, 0.0).exp()
        if tis_cap is not None:
            truncated = tis > tis_cap
            tis = tis.clamp(max=tis_cap)
        surrogate = surrogate * tis
        slope = slope * tis
    kl = kl_slope = None
    if ref_logp is not None:
        kl, kl_slope = _kl(torch.where(active, logp - ref_logp, 0.0), kl_estimator)
    return _Terms(active, weights, ratio, slope, surrogate, tis, truncated, clipped > plain,
                  kl, kl_slope, lengths)


def _masked_mean(values: Tensor, active: Tensor) -> Tensor:
    count = active.sum().clamp(min=1).to(torch.float32)
    return torch.where(active, values.to(torch.float32), 0.0).sum() / count


def forward(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
            ref_logp: Tensor | None, rollout_logp: Tensor | None, *, clip_low: float,
            clip_high: float, dual_clip: float | None, kl_coef: float, kl_estimator: str,
            ratio_level: str, agg: str, tis_cap: float | None) -> tuple[Tensor, Tensor]:
    t = _terms(logp, old_logp, advantages, mask, ref_logp, rollout_logp, clip_low=clip_low,
               clip_high=clip_high, dual_clip=dual_clip, kl_estimator=kl_estimator,
               ratio_level=ratio_level, agg=agg, tis_cap=tis_cap)
    per_token = t.surrogate
    if t.kl is not None and kl_coef != 0.0:
        per_token = per_token + kl_coef * t.kl
    loss = torch.where(t.active, t.weights * per_token, 0.0).sum()
    zero = logp.new_zeros(())
    metrics = torch.stack([
        _masked_mean(t.clipped, t.active),
        _masked_mean(t.ratio, t.active),
        zero if t.kl is None else _masked_mean(t.kl, t.active),
        zero if t.truncated is None else _masked_mean(t.truncated, t.active),
    ])
    return loss, metrics


def backward(grad_loss: Tensor, logp: Tensor, old_logp: Tensor, advantages: Tensor,
             mask: Tensor, ref_logp: Tensor | None, rollout_logp: Tensor | None, *,
             clip_low: float, clip_high: float, dual_clip: float | None, kl_coef: float,
             kl_estimator: str, ratio_level: str, agg: str, tis_cap: float | None) -> Tensor:
    t = _terms(logp, old_logp, advantages, mask, ref_logp, rollout_logp, clip_low=clip_low,
               clip_high=clip_high, dual_clip=dual_clip, kl_estimator=kl_estimator,
               ratio_level=ratio_level, agg=agg, tis_cap=tis_cap)
    through_ratio = torch.where(t.active, t.weights * t.slope, 0.0)
    if ratio_level == "sequence":
        # the sequence log-ratio is the mask-weighted mean of the token log-ratios
        per_seq = through_ratio.sum(dim=1) / t.lengths.clamp(min=1e-30)
        through_ratio = mask * per_seq.unsqueeze(1)
    grad = through_ratio
    if t.kl_slope is not None and kl_coef != 0.0:
        grad = grad + torch.where(t.active, t.weights * kl_coef * t.kl_slope, 0.0)
    return grad * grad_loss.to(torch.float32)
