"""The float64 reference of `policy_loss`.

Float64 ground truth for tests and `rlk-core doctor --smoke` only: it favours clarity over
memory, so never call it on production-sized inputs.
"""

from __future__ import annotations

import math

import torch

from rlk.ops.policy_loss.options import PolicyLossOptions


def aggregate(values: torch.Tensor, keep: torch.Tensor, o: PolicyLossOptions) -> torch.Tensor:
    """`values` [B, T] aggregated over the kept positions by the options' agg, divisor,
    count_empty_rows and scale (docs/ops/policy_loss.md), one sequence at a time."""
    counts = [int(row.sum()) for row in keep]
    row_sums = [values[i][keep[i]].sum() for i in range(len(counts))]
    if o.agg == "seq-mean-token-mean":
        row_sums = [total / max(count, 1) for total, count in zip(row_sums, counts, strict=True)]
    total = sum(row_sums, values.sum() * 0.0)
    rows = len(counts) if o.count_empty_rows else sum(count > 0 for count in counts)
    natural = {"token-mean": sum(counts), "token-sum": 1, "seq-mean-token-mean": rows,
               "seq-mean-token-sum": rows, "seq-mean-token-sum-norm": rows * values.shape[1]}
    divisor = o.divisor if o.divisor is not None else max(natural[o.agg], 1)
    return o.scale * total / divisor


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logp: torch.Tensor | None = None,
    rollout_logp: torch.Tensor | None = None,
    importance_weights: torch.Tensor | None = None,
    options: PolicyLossOptions | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 policy loss and its metrics (in `METRICS` order), differentiable w.r.t. `logp`.

    Each option is written as its source writes it, with autograd taking the gradient:
    TRL 1.16 `GRPOTrainer._compute_loss` (sequence ratio, ratio cap `delta`, CISPO's
    one-sided clip, SAPO, VESPO's `get_gamma_weights`, k3, KL bias correction) and verl
    0.9.1 `core_algos` (dual clip, log-ratio clamp, GSPO-token, two-sided CISPO,
    `kl_penalty` with its clamp and "+" straight-through, `agg_loss`). Aggregation runs
    one sequence at a time. Masked positions are zeroed before anything reads them.
    """
    o = options if options is not None else PolicyLossOptions()
    f64 = torch.float64
    keep = mask != 0

    def clean(values: torch.Tensor) -> torch.Tensor:
        values = values.to(f64)
        return torch.where(keep, values.unsqueeze(1) if values.dim() == 1 else values, 0.0)

    lp, old, adv = clean(logp), clean(old_logp), clean(advantages)
    m = keep.to(f64)
    lengths = m.sum(dim=-1)
    log_ratio = lp - old
    weight, truncated = None, torch.zeros_like(keep)
    if rollout_logp is not None:
        weight = torch.exp(old - clean(rollout_logp))
        if o.tis_cap is not None:
            truncated = weight > o.tis_cap
            weight = torch.clamp(weight, max=o.tis_cap)
    if importance_weights is not None:
        weight = clean(importance_weights) if weight is None else weight * clean(importance_weights)
    sequence = ((log_ratio * m).sum(-1) / lengths.clamp(min=1.0)).unsqueeze(-1)
    if o.ratio_level == "sequence":  # TRL: importance_sampling_level="sequence"
        log_weights = sequence.expand_as(lp)
    elif o.ratio_level == "sequence-token":  # verl gspo: sg[s_i] * pi / sg[pi]
        log_weights = lp - lp.detach() + sequence.detach()
    else:
        log_weights = log_ratio
    if o.log_ratio_min is not None or o.log_ratio_max is not None:
        log_weights = torch.clamp(log_weights, min=o.log_ratio_min, max=o.log_ratio_max)
    coef_1 = torch.exp(log_weights)
    zero = torch.zeros_like(keep)
    clipped = low = high = dual = zero
    if o.objective == "ppo":
        coef_2 = torch.clamp(coef_1, 1 - o.clip_low, 1 + o.clip_high)
        capped = coef_1 if o.ratio_cap is None else torch.clamp(coef_1, max=o.ratio_cap)
        per_token = -torch.min(capped * adv, coef_2 * adv)
        clipped = -coef_2 * adv > -capped * adv
        low, high = (capped < 1 - o.clip_low) & (adv < 0), (capped > 1 + o.clip_high) & (adv > 0)
        if o.dual_clip is not None:
            dual = (adv < 0) & (per_token > -adv * o.dual_clip)
            per_token = torch.where(adv < 0, torch.min(-adv * o.dual_clip, per_token), per_token)
    elif o.objective == "cispo":
        bounded = torch.clamp(coef_1, 1 - o.clip_low, 1 + o.clip_high)
        per_token = -bounded.detach() * adv * lp
        clipped = coef_1 != bounded
        low, high = (coef_1 < 1 - o.clip_low) & (adv < 0), (coef_1 > 1 + o.clip_high) & (adv > 0)
    elif o.objective == "sapo":
        tau = torch.where(adv > 0, o.sapo_temperature_pos, o.sapo_temperature_neg).to(f64)
        per_token = -torch.sigmoid(tau * (coef_1 - 1)) * 4 / tau * adv
    else:  # vespo
        with torch.no_grad():
            total = (torch.clamp(log_ratio, -20.0, 20.0) * m).sum(-1, keepdim=True)
            if weight is not None:
                logs = torch.clamp(torch.log(weight), math.log(1e-8), 20.0)
                total = total + (logs * m).sum(-1, keepdim=True)
            log_w = torch.clamp(total, math.log(1e-8), 20.0)
            nonneg = adv >= 0
            k = torch.where(nonneg, o.vespo_k_pos, o.vespo_k_neg).to(f64)
            lam = torch.where(nonneg, o.vespo_lambda_pos, o.vespo_lambda_neg).to(f64)
            phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
            phi = phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
        per_token = -phi * adv * lp
    if weight is not None and o.objective != "vespo":
        per_token = per_token * weight
    kl = torch.zeros_like(lp)
    if ref_logp is not None:
        ref = clean(ref_logp)
        kl = {"k1": lambda: lp - ref, "k2": lambda: 0.5 * (lp - ref).square(),
              "k3": lambda: torch.exp(ref - lp) - (ref - lp) - 1,
              "abs": lambda: (lp - ref).abs()}[o.kl_base]()
        if o.kl_clamp is not None:
            kl = torch.clamp(kl, min=-o.kl_clamp, max=o.kl_clamp)
        if o.kl_straight_through:
            square = 0.5 * (lp - ref).square()
            kl = square - square.detach() + kl.detach()
        if o.kl_bias_correction:
            kl = kl * coef_1
        per_token = per_token + o.kl_coef * kl
    per_token = torch.where(keep, per_token, 0.0)
    rows = range(lp.shape[0])
    sums = [per_token[i][keep[i]].sum() for i in rows]
    nonempty = [i for i in rows if lengths[i] > 0]
    sequences = lp.shape[0] if o.count_empty_rows else len(nonempty)
    total = per_token.sum() * 0.0  # keeps the graph when no sequence has a token
    if o.agg == "seq-mean-token-mean":
        total = sum((sums[i] / lengths[i] for i in nonempty), total)
    else:
        total = sum((sums[i] for i in nonempty), total)
    divisor = {"token-mean": max(int(lengths.sum()), 1), "token-sum": 1,
               "seq-mean-token-mean": max(sequences, 1), "seq-mean-token-sum": max(sequences, 1),
               "seq-mean-token-sum-norm": max(sequences * lp.shape[1], 1)}[o.agg]
    loss = o.scale * total / (divisor if o.divisor is None else o.divisor)
    count = max(int(lengths.sum()), 1)

    def token_mean(values: torch.Tensor) -> torch.Tensor:
        return values.detach().to(f64)[keep].sum() / count

    def clip_mean(values: torch.Tensor) -> torch.Tensor:
        if o.ratio_level == "token":
            return token_mean(values)
        per_row = [values[i][keep[i]].to(f64).mean() for i in nonempty]
        return sum(per_row, lp.new_zeros(())) / max(len(nonempty), 1)

    metrics = torch.stack([clip_mean(clipped), clip_mean(low), clip_mean(high), clip_mean(dual),
                           token_mean(coef_1), token_mean(kl), token_mean(truncated)])
    return loss, metrics
