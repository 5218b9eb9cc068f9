"""Float64 references: the ground truth of every op, for tests and `doctor --smoke` only.

They favour clarity over memory: never call them on production-sized inputs.
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

    Leading dimensions of `logits` match `tokens`; a per-row temperature has the
    same shape as `tokens`. ignore_index gives 0 for both; an out-of-range token
    gives NaN logp; non-finite rows give NaN.
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
    valid = (tokens >= 0) & (tokens < vocab)
    picked = log_probs.gather(-1, tokens.clamp(0, max(vocab - 1, 0)).unsqueeze(-1)).squeeze(-1)
    logp = torch.where(valid, picked, torch.nan)
    finite = torch.isfinite(lse)
    logp = torch.where(finite, logp, torch.nan)
    entropy = torch.where(finite, entropy, torch.nan)
    ignored = tokens == ignore_index
    return logp.masked_fill(ignored, 0.0), entropy.masked_fill(ignored, 0.0)


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
    x = logits.to(torch.float64).requires_grad_(True)
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


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    normalize: str = "std",
    baseline: str = "mean",
    eps: float = 1e-6,
) -> torch.Tensor:
    """Float64 group advantages, one group at a time.

    baseline "mean": reward minus the group mean; "loo": minus the mean of the
    other members (0 for a group of one). normalize "std": divided by the group's
    sample std (Bessel-corrected; 0 for a group of one) plus eps. Constant groups give 0.
    """
    values = rewards.detach().to(torch.float64)
    out = torch.zeros_like(values)
    for group in torch.unique(group_ids):
        members = (group_ids == group).nonzero().squeeze(1)
        r = values[members]
        size = r.numel()
        if baseline == "mean":
            adv = r - r.mean()
        else:
            adv = r - (r.sum() - r) / max(size - 1, 1) if size > 1 else torch.zeros_like(r)
        if normalize == "std":
            std = r.std() if size > 1 else torch.zeros((), dtype=torch.float64)
            adv = adv / (std + eps) if bool(std > 0) or eps > 0 else torch.zeros_like(r)
        if bool((r == r[0]).all()):
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
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    ratio_level: str = "token",
    agg: str = "token-mean",
    tis_cap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 policy loss and metrics [clip_fraction, mean_ratio, mean_kl, truncated_fraction].

    Written as the papers state it (PPO's min of clipped and unclipped objectives,
    dual-clip's max with c * A for negative advantages, GSPO's length-normalised
    sequence ratio, Schulman's k1/k2/k3) with one sequence at a time for the
    aggregation. Differentiable w.r.t. `logp` by autograd.
    """
    f64 = torch.float64
    keep = mask.to(torch.bool)

    def clean(values: torch.Tensor) -> torch.Tensor:
        return torch.where(keep, values.to(f64), 0.0)

    lp, old = clean(logp), clean(old_logp)
    adv = advantages.to(f64)
    adv = clean(adv if adv.dim() == 2 else adv.unsqueeze(1).expand_as(lp))
    lengths = keep.sum(dim=1)
    ratio = torch.exp(lp - old)
    if ratio_level == "sequence":
        seq = torch.stack([torch.exp((lp[i] - old[i])[keep[i]].mean()) if lengths[i] > 0
                           else lp.new_ones(()) for i in range(lp.shape[0])])
        ratio = seq.unsqueeze(1).expand_as(lp)
    clipped_ratio = ratio.clamp(1 - clip_low, 1 + clip_high)
    objective = torch.minimum(ratio * adv, clipped_ratio * adv)
    if dual_clip is not None:
        objective = torch.where(adv < 0, torch.maximum(objective, dual_clip * adv), objective)
    term = -objective
    truncated = torch.zeros_like(lp, dtype=torch.bool)
    if rollout_logp is not None:
        weight = torch.exp(old - clean(rollout_logp))
        if tis_cap is not None:
            truncated = weight > tis_cap
            weight = torch.minimum(weight, torch.full_like(weight, tis_cap))
        term = term * weight
    kl = torch.zeros_like(lp)
    if ref_logp is not None:
        log_r = clean(ref_logp) - lp  # log(pi_ref / pi)
        kl = {"k1": -log_r, "k2": 0.5 * log_r**2, "k3": log_r.exp() - 1 - log_r}[kl_estimator]
        term = term + kl_coef * kl
    term = torch.where(keep, term, 0.0)
    sums = [term[i][keep[i]].sum() for i in range(lp.shape[0])]
    nonempty = [i for i in range(lp.shape[0]) if lengths[i] > 0]
    zero = term.sum() * 0.0  # keeps the graph when no sequence has a token
    if agg == "token-mean":
        loss = term.sum() / max(int(lengths.sum()), 1)
    elif agg == "seq-mean-token-mean":
        loss = sum((sums[i] / lengths[i] for i in nonempty), zero) / max(len(nonempty), 1)
    elif agg == "seq-mean-token-sum":
        loss = sum((sums[i] for i in nonempty), zero) / max(len(nonempty), 1)
    else:
        loss = term.sum() / max(lp.numel(), 1)
    count = max(int(lengths.sum()), 1)
    took_clip = (clipped_ratio * adv < ratio * adv) & keep
    metrics = torch.stack([
        took_clip.sum().to(f64) / count,
        ratio.detach()[keep].sum() / count,
        kl.detach()[keep].sum() / count,
        (truncated & keep).sum().to(f64) / count,
    ])
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
