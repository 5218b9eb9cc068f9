"""Float64 references: the ground truth of every op, for tests and `doctor --smoke` only.

They favour clarity over memory: never call them on production-sized inputs.
"""

from __future__ import annotations

import math

import torch

from rlk.ops.group_advantages.options import GroupAdvantagesOptions
from rlk.ops.policy_loss.options import PolicyLossOptions


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
        loss = loss - entropy_coef * _aggregate(entropy2, keep, o)
    entropy_mean = entropy2.detach()[keep].sum() / max(int(keep.sum()), 1)
    return loss, torch.cat([metrics, entropy_mean.reshape(1)]), logp


def _aggregate(values: torch.Tensor, keep: torch.Tensor, o: PolicyLossOptions) -> torch.Tensor:
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


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    options: GroupAdvantagesOptions | None = None,
) -> torch.Tensor:
    """Float64 group advantages, one group at a time.

    As TRL 1.16 (GRPO: r - mean, over the group's or, scale_rewards="batch", the batch's
    std plus eps; RLOO: r - (sum - r) / (n - 1); NaN rewards left out of the statistics and
    given 0) and verl 0.9.1 (compute_grpo_outcome_advantage / compute_rloo_outcome_advantage:
    a group of one has mean 0 and std 1) write them. Stds are Bessel-corrected. A group
    whose rewards are all equal gives 0; so does a group of one unless
    singleton="reward"; a NaN reward under nan="propagate" makes its group NaN.
    """
    o = options if options is not None else GroupAdvantagesOptions()
    f64 = torch.float64
    values = rewards.detach().to(f64)
    valid = ~values.isnan() if o.nan == "ignore" else torch.ones_like(values, dtype=torch.bool)
    kept = values[valid]
    batch_std = kept.std() if kept.numel() > 1 else values.new_zeros(())
    out = torch.zeros_like(values)
    for group in torch.unique(group_ids):
        members = ((group_ids == group) & valid).nonzero().squeeze(1)
        r = values[members]
        size = r.numel()
        if size == 0:
            continue
        if bool(r.isnan().any()):  # nan="propagate"
            out[members] = torch.nan
            continue
        if size == 1:
            mean, std = values.new_zeros(()), values.new_ones(())
            if o.singleton == "zero":
                out[members] = 0.0
                continue
        else:
            mean, std = r.mean(), r.std()
        adv = r - mean if o.baseline == "mean" or size == 1 else r - (r.sum() - r) / (size - 1)
        if o.normalize == "std":
            adv = adv / (std + o.eps)
        elif o.normalize == "batch-std":
            adv = adv / (batch_std + o.eps)
        if size > 1 and bool((r == r[0]).all()):
            adv = torch.zeros_like(r)
        out[members] = adv
    return out


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


def sample_log_probs(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
) -> torch.Tensor:
    """Float64 log-probabilities [B, V] of the distribution `sample` draws from.

    Filters in order: temperature, top-k (ties with the k-th value kept), top-p (the
    smallest prefix, in descending order, whose mass reaches top_p; ties with its
    last token kept), min-p (p >= min_p * max p). -inf outside the kept set; rows
    without a valid token (NaN, +inf, all -inf) are NaN. Temperature 0 is a point
    mass on the first most likely token.
    """
    x = logits.detach().to(torch.float64)
    rows, vocab = x.shape
    out = torch.full_like(x, -torch.inf)
    for row in range(rows):
        values = x[row]
        if not bool(torch.isfinite(torch.logsumexp(values, dim=0))):
            out[row] = torch.nan
            continue
        if temperature == 0.0:
            out[row, int(values.argmax())] = 0.0
            continue
        values = values / temperature
        keep = torch.ones(vocab, dtype=torch.bool, device=values.device)
        if 0 < top_k < vocab:
            keep &= values >= values.sort(descending=True).values[top_k - 1]
        if top_p < 1.0:
            probs = torch.where(keep, values, -torch.inf).softmax(dim=0)
            ordered = probs.sort(descending=True).values
            ahead = torch.cat([ordered.new_zeros(1), ordered.cumsum(0)[:-1]])
            last = int((ahead < top_p).sum()) - 1
            keep &= probs >= ordered[max(last, 0)]
        if min_p > 0.0:
            probs = values.softmax(dim=0)
            keep &= probs >= min_p * probs.max()
        kept = torch.where(keep, values, -torch.inf)
        out[row] = kept - torch.logsumexp(kept, dim=0)
    return out
