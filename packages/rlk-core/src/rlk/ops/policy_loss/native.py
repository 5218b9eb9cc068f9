"""Native policy_loss: every option's per-token math, the aggregation, an analytic backward.

The loss is sum(c * term) over real tokens, where the weights c come from the mask and the
aggregation options alone (`aggregation_weights`). Each token's term and its derivatives
come from `token_terms`; for token-level options nothing else is needed, so
`token_loss_and_grad` gives a chunk of tokens its loss contribution and d loss / d logp as
soon as their logp exist (what rlk.linear_policy_loss builds on). Options with
`needs_sequence_pass` first need a statistic of each whole sequence (`sequence_statistics`).

Everything is float32; inputs of other dtypes are converted, the gradient is returned in
logp's dtype. Masked positions never reach a result, whatever they hold (NaN included).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from rlk.ops.policy_loss.options import CLIP_METRICS, METRICS, PolicyLossOptions

F32 = torch.float32
VESPO_LOG_RATIO_BOUND = 20.0  # TRL clamps each token's log ratio to ±20 before summing
VESPO_LOG_WEIGHT_MIN = math.log(1e-8)  # and the sequence's log weight to [log 1e-8, 20]
VESPO_LOG_WEIGHT_MAX = 20.0


@dataclass
class TokenTerms:
    """Per-token pieces of the loss before aggregation (0 at masked tokens).

    value: the token's term (policy term times its importance weight, plus kl_coef * KL);
    grad_logp: d value / d logp with the log ratio held fixed (CISPO/VESPO's logp factor,
    the KL); grad_log_ratio: d value / d log ratio; grad_alone: d value / d logp were the
    token its ratio's only one (grad_logp + grad_log_ratio, the bias-corrected KL's two
    parts summed without cancellation); stats: [..., len(METRICS)] the per-token quantities
    the metrics average.
    """

    value: Tensor
    grad_logp: Tensor
    grad_log_ratio: Tensor
    grad_alone: Tensor
    stats: Tensor


class TokenLoss(NamedTuple):
    """A chunk's share of the loss: per-token `loss` (c * term), `grad` (d loss / d logp)
    and `stats` (the metric quantities, 0 at masked tokens), all float32."""

    loss: Tensor
    grad: Tensor
    stats: Tensor


def _real(mask: Tensor) -> Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def aggregation_weights(mask: Tensor, options: PolicyLossOptions) -> Tensor:
    """[B, T] float32 weights c with loss = sum(c * term): from the mask (nonzero = a real
    token) and the aggregation options alone, so they exist before any logp does."""
    real = _real(mask).to(F32)
    lengths = real.sum(dim=1)
    if options.divisor is not None:
        divisor: Tensor | float = options.divisor
    elif options.agg == "token-mean":
        divisor = lengths.sum().clamp(min=1.0)
    elif options.agg == "token-sum":
        divisor = 1.0
    else:
        sequences = (real.new_tensor(float(mask.shape[0])) if options.count_empty_rows
                     else (lengths > 0).sum().to(F32))
        if options.agg == "seq-mean-token-sum-norm":
            sequences = sequences * mask.shape[1]
        divisor = sequences.clamp(min=1.0)
    per_row = real.new_full((mask.shape[0],), options.scale) / divisor
    if options.agg == "seq-mean-token-mean":
        per_row = torch.where(lengths > 0, per_row / lengths.clamp(min=1.0), 0.0)
    return real * per_row.unsqueeze(1)


def importance_weight(old_logp: Tensor, rollout_logp: Tensor | None,
                      importance_weights: Tensor | None,
                      options: PolicyLossOptions) -> tuple[Tensor | None, Tensor | None]:
    """The weight on each token's policy term, and where the TIS cap truncated it.

    exp(old_logp - rollout_logp), capped at tis_cap, times the caller's importance_weights
    (either may be absent: then (None, None) or no truncation)."""
    weight = truncated = None
    if rollout_logp is not None:
        weight = (old_logp - rollout_logp).exp()
        if options.tis_cap is not None:
            truncated = weight > options.tis_cap
            weight = weight.clamp(max=options.tis_cap)
    if importance_weights is not None:
        weight = importance_weights if weight is None else weight * importance_weights
    return weight, truncated


def sequence_statistics(logp: Tensor, old_logp: Tensor, real: Tensor,
                        weight: Tensor | None, options: PolicyLossOptions) -> Tensor | None:
    """The per-sequence number a two-pass option needs, broadcast over the sequence ([B, 1]):
    the mean token log ratio for a sequence-level ratio (GSPO), VESPO's log sequence weight;
    None for token-level options. Tensors are [B, T] float32, 0 at masked tokens."""
    if options.objective == "vespo":
        bound = VESPO_LOG_RATIO_BOUND
        total = ((logp - old_logp).clamp(-bound, bound) * real).sum(dim=1, keepdim=True)
        if weight is not None:
            logs = weight.log().clamp(VESPO_LOG_WEIGHT_MIN, VESPO_LOG_WEIGHT_MAX)
            total = total + (logs * real).sum(dim=1, keepdim=True)
        return total.clamp(VESPO_LOG_WEIGHT_MIN, VESPO_LOG_WEIGHT_MAX)
    if options.ratio_level == "token":
        return None
    lengths = real.sum(dim=1, keepdim=True).clamp(min=1.0)
    return ((logp - old_logp) * real).sum(dim=1, keepdim=True) / lengths


def token_terms(logp: Tensor, old_logp: Tensor, advantages: Tensor, real: Tensor,
                options: PolicyLossOptions, *, ref_logp: Tensor | None = None,
                weight: Tensor | None = None, truncated: Tensor | None = None,
                sequence: Tensor | None = None) -> TokenTerms:
    """Each token's term and its derivatives; tensors broadcast to one shape, float32.

    real: 1.0 at real tokens (inputs should be 0 elsewhere); weight/truncated from
    `importance_weight`; sequence from `sequence_statistics` when the options need it.
    """
    active = real != 0
    if options.ratio_level == "token" or options.objective == "vespo":
        log_ratio = logp - old_logp
    else:
        log_ratio = sequence.expand_as(logp) if sequence is not None else logp - old_logp
    passes = torch.ones_like(log_ratio, dtype=torch.bool)
    if options.log_ratio_min is not None or options.log_ratio_max is not None:
        low, high = options.log_ratio_min, options.log_ratio_max
        # NaN passes, so a NaN input gives a NaN gradient rather than a silent 0
        outside = torch.zeros_like(passes)
        if low is not None:
            outside = outside | (log_ratio < low)
        if high is not None:
            outside = outside | (log_ratio > high)
        passes = ~outside
        log_ratio = log_ratio.clamp(min=low, max=high)
    ratio = log_ratio.exp()
    zero = torch.zeros_like(ratio)
    policy, policy_logp, through_ratio, clip_stats = _OBJECTIVES[options.objective](
        logp, advantages, log_ratio, ratio, options, sequence)
    through_ratio = torch.where(passes, through_ratio * ratio, 0.0)
    if weight is not None and options.objective != "vespo":
        policy, policy_logp = policy * weight, policy_logp * weight
        through_ratio = through_ratio * weight
    kl = zero
    value, grad_logp = policy, policy_logp
    grad_alone = policy_logp + through_ratio
    if ref_logp is not None:
        kl, kl_logp, kl_ratio, kl_alone = _kl_term(logp - ref_logp, ratio, passes, options)
    if ref_logp is not None and options.kl_coef != 0.0:  # else 0 * an overflowed KL is NaN
        coef = options.kl_coef
        value = value + coef * kl
        grad_logp = grad_logp + coef * kl_logp
        through_ratio = through_ratio + coef * kl_ratio
        grad_alone = grad_alone + coef * kl_alone
    stats = torch.stack([*clip_stats, ratio, kl,
                         zero if truncated is None else truncated.to(F32)], dim=-1)
    return TokenTerms(
        value=torch.where(active, value, 0.0),
        grad_logp=torch.where(active, grad_logp, 0.0),
        grad_log_ratio=torch.where(active, through_ratio, 0.0),
        grad_alone=torch.where(active, grad_alone, 0.0),
        stats=torch.where(active.unsqueeze(-1), stats, 0.0),
    )


Objective = tuple[Tensor, Tensor, Tensor, list[Tensor]]


def _ppo(logp: Tensor, adv: Tensor, log_ratio: Tensor, ratio: Tensor, o: PolicyLossOptions,
         sequence: Tensor | None) -> Objective:
    """max(-A r, -A clip(r)) with TRL's ratio cap (delta) and verl's dual clip.

    Returns (term, d term / d logp, d term / d ratio, clip indicators)."""
    capped = ratio if o.ratio_cap is None else ratio.clamp(max=o.ratio_cap)
    plain = -adv * capped
    clipped = -adv * ratio.clamp(1.0 - o.clip_low, 1.0 + o.clip_high)
    took_clip = clipped > plain
    term = torch.maximum(plain, clipped)
    # a clamp passes the gradient unless it binds; written as "not outside" so that a NaN
    # ratio keeps flowing (and stays NaN) instead of giving a silent 0
    inside = ~((ratio < 1.0 - o.clip_low) | (ratio > 1.0 + o.clip_high))
    below_cap = torch.ones_like(inside) if o.ratio_cap is None else ~(ratio > o.ratio_cap)
    slope = -adv * torch.where(took_clip, inside, below_cap).to(F32)
    dual = torch.zeros_like(took_clip)
    if o.dual_clip is not None:
        floor = -adv * o.dual_clip
        dual = (adv < 0) & (term > floor)
        term = torch.where(dual, floor, term)
        slope = torch.where(dual, 0.0, slope)
    low, high = _clip_sides(capped, adv, o)
    return term, torch.zeros_like(term), slope, [took_clip.to(F32), low, high, dual.to(F32)]


def _cispo(logp: Tensor, adv: Tensor, log_ratio: Tensor, ratio: Tensor,
           o: PolicyLossOptions, sequence: Tensor | None) -> Objective:
    """-sg(clip(r)) * A * logp: the clipped ratio weighs the log-prob and carries no gradient."""
    weight = ratio.clamp(1.0 - o.clip_low, 1.0 + o.clip_high)
    outside = (ratio < 1.0 - o.clip_low) | (ratio > 1.0 + o.clip_high)
    low, high = _clip_sides(ratio, adv, o)
    zero = torch.zeros_like(ratio)
    return -weight * adv * logp, -weight * adv, zero, [outside.to(F32), low, high, zero]


def _sapo(logp: Tensor, adv: Tensor, log_ratio: Tensor, ratio: Tensor,
          o: PolicyLossOptions, sequence: Tensor | None) -> Objective:
    """-A * (4 / tau) * sigmoid(tau * (r - 1)), tau by the sign of A (SAPO's soft gate).

    The gate's derivative is sigmoid(x) * sigmoid(-x), not gate * (1 - gate): near
    saturation 1 - gate cancels to 0 in float32 while sigmoid(-x) keeps every digit;
    r - 1 is expm1 of the log ratio for the same reason."""
    tau = torch.where(adv > 0, o.sapo_temperature_pos, o.sapo_temperature_neg)
    x = tau * torch.expm1(log_ratio)
    gate = torch.sigmoid(x)
    zero = torch.zeros_like(ratio)
    return (-adv * gate * 4.0 / tau, zero, -adv * 4.0 * gate * torch.sigmoid(-x),
            [zero, zero, zero, zero])


def _vespo(logp: Tensor, adv: Tensor, log_ratio: Tensor, ratio: Tensor,
           o: PolicyLossOptions, sequence: Tensor | None) -> Objective:
    """-phi(w) * A * logp with phi(w) = exp(lambda + k log w - lambda w) of the sequence
    weight w (detached; non-finite phi counts as 0, as in TRL)."""
    assert sequence is not None, "vespo needs sequence_statistics"
    nonneg = adv >= 0
    k = torch.where(nonneg, o.vespo_k_pos, o.vespo_k_neg)
    lam = torch.where(nonneg, o.vespo_lambda_pos, o.vespo_lambda_neg)
    phi = torch.exp(lam + k * sequence - lam * sequence.exp())
    phi = torch.nan_to_num(phi, nan=0.0, posinf=0.0, neginf=0.0)
    zero = torch.zeros_like(ratio)
    return -phi * adv * logp, -phi * adv, zero, [zero, zero, zero, zero]


_OBJECTIVES = {"ppo": _ppo, "cispo": _cispo, "sapo": _sapo, "vespo": _vespo}


def _clip_sides(ratio: Tensor, adv: Tensor, o: PolicyLossOptions) -> tuple[Tensor, Tensor]:
    """TRL's clip_ratio/low and /high: the ratio beyond the bound on the side that clips."""
    low = (ratio < 1.0 - o.clip_low) & (adv < 0)
    high = (ratio > 1.0 + o.clip_high) & (adv > 0)
    return low.to(F32), high.to(F32)


def _kl(delta: Tensor, o: PolicyLossOptions) -> tuple[Tensor, Tensor, Tensor]:
    """(k, dk/d delta, dk/d delta + k) of the KL estimate k at delta = logp - ref, clamped.

    The last is what the bias-corrected term k * r has per unit r when r is this token's
    ratio; it is written without cancellation (k3: exactly delta, where
    (1 - e^-delta) + (e^-delta - 1 + delta) loses every digit in float32 at delta << 0)."""
    base = o.kl_base
    if base == "k1":
        value, slope, both = delta, torch.ones_like(delta), 1.0 + delta
    elif base == "k2":
        value, slope = 0.5 * delta * delta, delta
        both = delta * (1.0 + 0.5 * delta)
    elif base == "k3":
        back = torch.expm1(-delta)  # e^-delta - 1, exact near delta = 0
        value, slope, both = back + delta, -back, delta
    else:  # abs
        value, slope = delta.abs(), delta.sign()
        both = slope + value
    if o.kl_clamp is not None:
        inside = ~((value < -o.kl_clamp) | (value > o.kl_clamp))
        value = value.clamp(-o.kl_clamp, o.kl_clamp)
        slope = torch.where(inside, slope, 0.0)
        both = torch.where(inside, both, value)
    if o.kl_straight_through:
        slope, both = delta, delta + value
    return value, slope, both


def _kl_term(delta: Tensor, ratio: Tensor, passes: Tensor,
             o: PolicyLossOptions) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(value, d value / d logp, d value / d log ratio, their sum) of the KL term (before
    kl_coef); the sum is `_kl`'s cancellation-free form.

    Bias corrected, the term is k * r. When the ratio is the token's own (every ratio
    level but "sequence") both derivatives land on this token, so they are returned
    summed in d value / d logp, 0 through the ratio."""
    value, slope, both = _kl(delta, o)
    if not o.kl_bias_correction:
        return value, slope, torch.zeros_like(value), slope
    alone = torch.where(passes, both, slope) * ratio
    if o.ratio_level != "sequence":
        return value * ratio, alone, torch.zeros_like(value), alone
    return value * ratio, slope * ratio, torch.where(passes, value * ratio, 0.0), alone


def token_kl_and_grad(logp: Tensor, ref_logp: Tensor,
                      options: PolicyLossOptions) -> tuple[Tensor, Tensor]:
    """Each token's KL estimate (kl_estimator, kl_clamp) and its derivative d / d logp:
    the KL term policy_loss adds before kl_coef, without bias correction (what
    rlk.token_kl returns). Computed in the inputs' dtype."""
    if options.kl_bias_correction:
        raise ValueError("kl_bias_correction multiplies the KL by the policy ratio, which "
                         "needs old_logp: use policy_loss")
    value, slope, _ = _kl(logp - ref_logp, options)
    return value, slope


# ---------------------------------------------------------------------------
# token-level options on a chunk of tokens (what linear_policy_loss builds on)


def token_loss_and_grad(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
                        weights: Tensor, options: PolicyLossOptions, *,
                        ref_logp: Tensor | None = None, rollout_logp: Tensor | None = None,
                        importance_weights: Tensor | None = None) -> TokenLoss:
    """Loss contribution and d loss / d logp of any set of tokens, for options without a
    sequence pass. Every tensor has one shape (a chunk of flattened tokens, say); weights are
    those tokens' entries of `aggregation_weights`, advantages and importance_weights
    expanded to them. The loss is the sum of `.loss` over all chunks; a metric is the sum of
    its `.stats` column over all chunks divided by the number of real tokens."""
    if options.needs_sequence_pass:
        raise ValueError(f"ratio_level {options.ratio_level!r} / objective "
                         f"{options.objective!r} needs whole sequences first; "
                         "use rlk.ops.policy_loss.native.forward/backward")
    real = _real(mask)

    def clean(value: Tensor | None) -> Tensor | None:
        return None if value is None else torch.where(real, value.to(F32), 0.0)

    logp32, old, adv = clean(logp), clean(old_logp), clean(advantages)
    assert logp32 is not None and old is not None and adv is not None
    weight, truncated = importance_weight(old, clean(rollout_logp), clean(importance_weights),
                                          options)
    terms = token_terms(logp32, old, adv, real.to(F32), options,
                        ref_logp=clean(ref_logp), weight=weight, truncated=truncated)
    c = weights.to(F32)
    return TokenLoss(c * terms.value, c * terms.grad_alone, terms.stats)


# ---------------------------------------------------------------------------
# the kernels


@dataclass
class _Batch:
    """The kernel inputs as float32 [B, T] (0 at masked tokens), with the mask's counts."""

    logp: Tensor
    old: Tensor
    adv: Tensor
    real: Tensor
    lengths: Tensor
    ref: Tensor | None
    weight: Tensor | None
    truncated: Tensor | None
    sequence: Tensor | None

    @classmethod
    def of(cls, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
           ref_logp: Tensor | None, rollout_logp: Tensor | None,
           importance_weights: Tensor | None, options: PolicyLossOptions) -> _Batch:
        active = _real(mask)

        def clean(value: Tensor | None) -> Tensor | None:
            if value is None:
                return None
            if value.dim() == 1:  # one value per sequence
                value = value.unsqueeze(1)
            return torch.where(active, value.to(F32), 0.0)

        lp, old = clean(logp), clean(old_logp)
        assert lp is not None and old is not None
        real = active.to(F32)
        adv = clean(advantages)
        assert adv is not None
        weight, truncated = importance_weight(old, clean(rollout_logp),
                                              clean(importance_weights), options)
        return cls(lp, old, adv, real, real.sum(dim=1), clean(ref_logp), weight, truncated,
                   sequence_statistics(lp, old, real, weight, options))

    def terms(self, options: PolicyLossOptions) -> TokenTerms:
        return token_terms(self.logp, self.old, self.adv, self.real, options, ref_logp=self.ref,
                           weight=self.weight, truncated=self.truncated,
                           sequence=self.sequence)


def _metrics(stats: Tensor, batch: _Batch, options: PolicyLossOptions) -> Tensor:
    """Token means of the stats; clip statistics per sequence under a sequence-level ratio."""
    sums = stats.sum(dim=(0, 1))
    means = sums / batch.lengths.sum().clamp(min=1.0)
    if options.ratio_level == "token":
        return means
    nonempty = batch.lengths > 0
    per_row = stats[..., :CLIP_METRICS].sum(dim=1) / batch.lengths.clamp(min=1.0).unsqueeze(1)
    per_sequence = per_row.sum(dim=0) / nonempty.sum().clamp(min=1).to(F32)
    return torch.cat([per_sequence, means[CLIP_METRICS:]])


def forward(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
            ref_logp: Tensor | None, rollout_logp: Tensor | None,
            importance_weights: Tensor | None,
            options: PolicyLossOptions) -> tuple[Tensor, Tensor]:
    """The loss (0-d float32) and metrics (float32 [len(METRICS)], in METRICS order)."""
    batch = _Batch.of(logp, old_logp, advantages, mask, ref_logp, rollout_logp,
                      importance_weights, options)
    terms = batch.terms(options)
    loss = (aggregation_weights(mask, options) * terms.value).sum()
    return loss, _metrics(terms.stats, batch, options)


def backward(grad_loss: Tensor, logp: Tensor, old_logp: Tensor, advantages: Tensor,
             mask: Tensor, ref_logp: Tensor | None, rollout_logp: Tensor | None,
             importance_weights: Tensor | None, options: PolicyLossOptions) -> Tensor:
    """d(loss * grad_loss) / d logp, [B, T] in logp's dtype (exactly 0 at masked tokens)."""
    batch = _Batch.of(logp, old_logp, advantages, mask, ref_logp, rollout_logp,
                      importance_weights, options)
    terms = batch.terms(options)
    weights = aggregation_weights(mask, options)
    if options.ratio_level == "sequence":
        grad = _sequence_ratio_grad(terms, weights, batch.lengths)
    else:
        grad = weights * terms.grad_alone
    grad = grad * grad_loss.to(F32)
    return torch.where(batch.real != 0, grad, 0.0).to(logp.dtype)


def _sequence_ratio_grad(terms: TokenTerms, weights: Tensor, lengths: Tensor) -> Tensor:
    """d loss / d logp when every token's log ratio is its sequence's mean: a token's own
    terms plus 1 / L of the others' derivatives through the ratio. Summing all L of them and
    then adding grad_logp would cancel the bias-corrected KL's e^(ref - logp) * r between the
    two in float32 (-2.27 from 567.0 - 569.2 at one token); instead the token's own share is
    taken in the cancellation-free grad_alone, the others' as a float64 row sum minus its own."""
    count = lengths.clamp(min=1.0)[:, None]
    through = (weights * terms.grad_log_ratio).double()
    others = (through.sum(dim=1, keepdim=True) - through) / count
    own = weights * (terms.grad_logp * (1.0 - 1.0 / count) + terms.grad_alone / count)
    return own + others.to(F32)


__all__ = ["METRICS", "TokenLoss", "TokenTerms", "aggregation_weights", "backward", "forward",
           "importance_weight", "sequence_statistics", "token_kl_and_grad", "token_loss_and_grad",
           "token_terms"]
