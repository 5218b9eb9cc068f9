"""rlk inside verl: `patch()` routes verl's log-probs, entropy, policy losses, KL penalty
and group advantages to rlk.

    from rlk.integrations import verl as rlk_verl
    rlk_verl.patch()          # or: with rlk_verl.patched(): ...

What is routed (docs/integrations/verl.md has the option table):
- `verl.utils.torch_functional.logprobs_from_logits` -> `rlk.logp`, `entropy_from_logits`
  and `entropy_from_logits_with_chunking` -> `rlk.entropy`, in verl's output dtypes;
- the policy-loss registry's "vanilla", "gspo", "sapo", "cispo", "gpg" and "dro" entries,
  and the module's `compute_policy_loss_vanilla` / `compute_policy_loss_reinforce` (which
  "bypass_mode" calls) -> `rlk.policy_loss`; the entries rlk cannot express ("dppo_tv",
  "dppo_kl", "clip_cov", "kl_cov", "geo_mean") raise `UnsupportedOptionError`;
- `core_algos.kl_penalty` -> `rlk.token_kl`;
- the "grpo", "grpo_vectorized", "rloo" and "rloo_vectorized" advantage estimators (and
  `compute_grpo_outcome_advantage`, which verl's trainer calls by name) ->
  `rlk.group_advantages`.
A configuration or input rlk cannot express raises `UnsupportedOptionError`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

import rlk
from rlk.integrations._patching import Adapter, Patches, UnsupportedOptionError

SUPPORTED = ((0, 9), (0, 10))  # verl >=0.9,<0.10
TESTED = "verl 0.9.1"

# verl clamps log π/π_old to ±20 before exp in vanilla, sapo and cispo, and GSPO's
# sequence log ratio to at most 10
LOG_RATIO_BOUND = 20.0
GSPO_LOG_RATIO_MAX = 10.0

PolicyLoss = Callable[..., tuple[Tensor, dict[str, Any]]]


# ---------------------------------------------------------------------------
# log-probabilities and entropy


def logprobs_from_logits(logits: Tensor, labels: Tensor, inplace_backward: bool = True) -> Tensor:
    """log-softmax(logits) at `labels`, in the logits' dtype (verl's contract).

    `inplace_backward` is accepted for verl's signature: rlk's backward never
    overwrites the logits.
    """
    return rlk.logp(logits, labels, dtype=logits.dtype)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """The entropy of softmax(logits) per row, in the logits' dtype."""
    return rlk.entropy(logits, dtype=logits.dtype)


def entropy_from_logits_with_chunking(logits: Tensor, chunk_size: int = 2048) -> Tensor:
    """The entropy per row in float32, as verl's chunked variant returns it.

    `chunk_size` is verl's memory knob; rlk never holds the probabilities.
    """
    return rlk.entropy(logits, dtype=torch.float32)


# ---------------------------------------------------------------------------
# the policy losses


def _setting(config: Any, name: str, default: Any = None) -> Any:
    getter = getattr(config, "get", None)
    return getter(name, default) if getter is not None else getattr(config, name, default)


def _clip_range(config: Any) -> dict[str, Any]:
    clip = _setting(config, "clip_ratio")
    low, high = _setting(config, "clip_ratio_low"), _setting(config, "clip_ratio_high")
    return {"clip_low": clip if low is None else low, "clip_high": clip if high is None else high}


def aggregation(loss_agg_mode: str, config: Any, length: int) -> dict[str, Any]:
    """policy_loss's agg, divisor and scale for verl's `agg_loss` under the actor's
    `global_batch_info` (dp_size, batch_num_tokens, global_batch_size, loss_scale_factor)."""
    info = dict(_setting(config, "global_batch_info", None) or {})
    dp_size = float(info.get("dp_size") or 1)
    tokens, sequences = info.get("batch_num_tokens"), info.get("global_batch_size")
    settings: dict[str, Any] = {"agg": loss_agg_mode, "scale": dp_size}
    if loss_agg_mode == "token-sum":
        return settings
    if loss_agg_mode == "token-mean":
        global_count, name = tokens, "batch_num_tokens"
    elif loss_agg_mode in ("seq-mean-token-mean", "seq-mean-token-sum",
                           "seq-mean-token-sum-norm"):
        global_count, name = sequences, "global_batch_size"
    else:
        raise ValueError(f"Invalid loss_agg_mode: {loss_agg_mode}")
    if global_count is None and dp_size > 1:
        raise ValueError(f"loss_agg_mode={loss_agg_mode!r} with dp_size > 1 needs "
                         f"global_batch_info[{name!r}] (the global count), as in verl")
    if loss_agg_mode == "seq-mean-token-sum-norm":
        factor = info.get("loss_scale_factor")
        if global_count is not None:  # one constant: the global sequences times the horizon
            per_sequence = length if factor is None else float(factor)
            return {**settings, "agg": "seq-mean-token-sum",
                    "divisor": float(global_count) * per_sequence}
        if factor is not None:  # the local sequence mean over a constant horizon
            return {**settings, "agg": "seq-mean-token-sum", "scale": dp_size / float(factor)}
        return settings
    if global_count is not None:
        settings["divisor"] = float(global_count)
    return settings


def _policy_loss(old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor,
                 response_mask: Tensor, loss_agg_mode: str, config: Any,
                 rollout_is_weights: Tensor | None, *, ref_logp: Tensor | None = None,
                 **settings: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """rlk.policy_loss with verl's aggregation; `settings` are the mode's options."""
    if config is None:
        raise ValueError("verl's policy losses need the actor config")
    options = rlk.PolicyLossOptions(
        **settings, **aggregation(loss_agg_mode, config, response_mask.shape[-1]))
    return rlk.policy_loss(log_prob, old_log_prob, advantages, response_mask,
                           ref_logp=ref_logp, importance_weights=rollout_is_weights,
                           options=options)


def _reinforce(log_prob: Tensor, advantages: Tensor, response_mask: Tensor,
               loss_agg_mode: str, config: Any, weights: Tensor | None, *,
               ref_logp: Tensor | None = None, **settings: Any) -> Tensor:
    """-A·logp (times the weights): CISPO's term at old_logp = sg(logp), whose clipped
    ratio is exactly 1."""
    loss, _ = _policy_loss(log_prob.detach(), log_prob, advantages, response_mask,
                           loss_agg_mode, config, weights, ref_logp=ref_logp, objective="cispo",
                           **settings)
    return loss


def _negative_log_ratio(old_log_prob: Tensor, log_prob: Tensor, mask: Tensor,
                        bound: float | None = None) -> float:
    """verl's `actor/ppo_kl` diagnostic: the mask-weighted mean of log(π_old / π), clamped
    as the mode clamps it; whatever the log-probs hold where the mask is 0 (NaN at
    padding) stays out, as in verl's masked_mean."""
    values = (old_log_prob - log_prob.detach()).float()
    if bound is not None:
        values = values.clamp(-bound, bound)
    weights = mask.float()
    values = torch.where(mask != 0, values, 0.0) * weights
    return float(values.sum() / (weights.sum() + 1e-8))


def _clamped_metrics(old_log_prob: Tensor, log_prob: Tensor, mask: Tensor,
                     clip_fraction: float, lower_fraction: float) -> dict[str, float]:
    """verl's metrics for the losses that clamp the log ratio to ±20 (vanilla, sapo, cispo)."""
    return {"actor/pg_clipfrac": clip_fraction,
            "actor/ppo_kl": _negative_log_ratio(old_log_prob, log_prob, mask, LOG_RATIO_BOUND),
            "actor/pg_clipfrac_lower": lower_fraction}


def compute_policy_loss_vanilla(old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor,
                                response_mask: Tensor, loss_agg_mode: str = "token-mean",
                                config: Any = None, rollout_is_weights: Tensor | None = None,
                                ) -> tuple[Tensor, dict[str, Any]]:
    """verl's "vanilla" PPO loss: clip, dual-clip at clip_ratio_c, log ratio within ±20."""
    loss, metrics = _policy_loss(
        old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
        rollout_is_weights, **_clip_range(config), dual_clip=_setting(config, "clip_ratio_c", 3.0),
        log_ratio_min=-LOG_RATIO_BOUND, log_ratio_max=LOG_RATIO_BOUND)
    return loss, _clamped_metrics(old_log_prob, log_prob, response_mask,
                                  metrics["clip_fraction"].item(),
                                  metrics["dual_clip_fraction"].item())


def compute_policy_loss_gspo(old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor,
                             response_mask: Tensor, loss_agg_mode: str = "seq-mean-token-mean",
                             config: Any = None, rollout_is_weights: Tensor | None = None,
                             ) -> tuple[Tensor, dict[str, Any]]:
    """GSPO-token: the sequence ratio's value with each token's own gradient.

    verl's `pg_clipfrac` is a token mean where rlk counts clipped sequences, so it is not
    reported; `pg_clipfrac_lower` is verl's constant 0.
    """
    loss, _ = _policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
                           config, rollout_is_weights, **_clip_range(config),
                           ratio_level="sequence-token", log_ratio_max=GSPO_LOG_RATIO_MAX)
    return loss, {"actor/ppo_kl": _negative_log_ratio(old_log_prob, log_prob, response_mask),
                  "actor/pg_clipfrac_lower": 0.0}


def compute_policy_loss_sapo(old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor,
                             response_mask: Tensor, loss_agg_mode: str = "seq-mean-token-mean",
                             config: Any = None, rollout_is_weights: Tensor | None = None,
                             ) -> tuple[Tensor, dict[str, Any]]:
    """SAPO's soft gate; verl aggregates it seq-mean-token-mean whatever loss_agg_mode is
    (the actor's KL and entropy terms keep loss_agg_mode: verl adds them separately)."""
    loss, _ = _policy_loss(old_log_prob, log_prob, advantages, response_mask,
                           "seq-mean-token-mean", config, rollout_is_weights, objective="sapo",
                           sapo_temperature_pos=_setting(config, "tau_pos"),
                           sapo_temperature_neg=_setting(config, "tau_neg"),
                           log_ratio_min=-LOG_RATIO_BOUND, log_ratio_max=LOG_RATIO_BOUND)
    return loss, _clamped_metrics(old_log_prob, log_prob, response_mask, 0.0, 0.0)


def compute_policy_loss_cispo(old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor,
                              response_mask: Tensor, loss_agg_mode: str = "token-mean",
                              config: Any = None, rollout_is_weights: Tensor | None = None,
                              ) -> tuple[Tensor, dict[str, Any]]:
    """CISPO: -sg(clip(r)) · A · logp with verl's two-sided clip."""
    loss, metrics = _policy_loss(old_log_prob, log_prob, advantages, response_mask,
                                 loss_agg_mode, config, rollout_is_weights, objective="cispo",
                                 **_clip_range(config), log_ratio_min=-LOG_RATIO_BOUND,
                                 log_ratio_max=LOG_RATIO_BOUND)
    return loss, _clamped_metrics(old_log_prob, log_prob, response_mask,
                                  metrics["clip_fraction"].item(), 0.0)


def compute_policy_loss_gpg(old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor,
                            response_mask: Tensor, loss_agg_mode: str = "token-mean",
                            config: Any = None, rollout_is_weights: Tensor | None = None,
                            ) -> tuple[Tensor, dict[str, Any]]:
    """GPG: the plain policy gradient -A·logp (no ratio, no clip), and no metrics."""
    return _reinforce(log_prob, advantages, response_mask, loss_agg_mode, config,
                      rollout_is_weights), {}


def compute_policy_loss_dro(old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor,
                            response_mask: Tensor, loss_agg_mode: str = "token-mean",
                            config: Any = None, rollout_is_weights: Tensor | None = None,
                            ) -> tuple[Tensor, dict[str, Any]]:
    """DRO: -A·logp + β/2·(log π/π_old)², the penalty as k2 KL to π_old at kl_coef β."""
    beta = _setting(_setting(config, "policy_loss", {}) or {}, "dro_beta")
    if beta is None or beta <= 0:
        raise ValueError("policy_loss.dro_beta must be a positive value when using DRO")
    if rollout_is_weights is not None:
        raise UnsupportedOptionError(
            "policy_loss.loss_mode='dro' with rollout_is_weights: verl weighs DRO's "
            "log-ratio penalty too, rlk's importance weights weigh the policy term only")
    loss = _reinforce(log_prob, advantages, response_mask, loss_agg_mode, config, None,
                      ref_logp=old_log_prob, kl_coef=float(beta), kl_estimator="k2")
    return loss, {"actor/ppo_kl": _negative_log_ratio(old_log_prob, log_prob, response_mask)}


def compute_policy_loss_reinforce(rollout_log_prob: Tensor, log_prob: Tensor,
                                  advantages: Tensor, response_mask: Tensor,
                                  loss_agg_mode: str = "seq-mean-token-sum", config: Any = None,
                                  rollout_is_weights: Tensor | None = None,
                                  ) -> tuple[Tensor, dict[str, Any]]:
    """REINFORCE with optional IS weights (bypass_mode's "reinforce" loss type)."""
    loss = _reinforce(log_prob, advantages, response_mask, loss_agg_mode, config,
                      rollout_is_weights)
    return loss, {"actor/ppo_kl": _negative_log_ratio(rollout_log_prob, log_prob,
                                                      response_mask)}


def _refused(mode: str, reason: str) -> PolicyLoss:
    def refuse(*args: Any, **kwargs: Any) -> tuple[Tensor, dict[str, Any]]:
        raise UnsupportedOptionError(
            f"policy_loss.loss_mode={mode!r}: {reason}, which rlk.policy_loss cannot express "
            f"(rlk routes {', '.join(map(repr, POLICY_LOSSES))}; unpatch() to run verl's own)")
    refuse.__name__ = f"refused_{mode}"
    return refuse


POLICY_LOSSES: Mapping[str, PolicyLoss] = {
    "vanilla": compute_policy_loss_vanilla,
    "gspo": compute_policy_loss_gspo,
    "sapo": compute_policy_loss_sapo,
    "cispo": compute_policy_loss_cispo,
    "gpg": compute_policy_loss_gpg,
    "dro": compute_policy_loss_dro,
}
REFUSED_POLICY_LOSSES: Mapping[str, str] = {
    "dppo_tv": "DPPO masks tokens by the total variation between π and π_old",
    "dppo_kl": "DPPO masks tokens by the binary KL between π and π_old",
    "clip_cov": "Clip-Cov drops a random subset of the tokens of high advantage-logp "
                "covariance",
    "kl_cov": "KL-Cov penalises |log ratio| on the top-k tokens by advantage-logp covariance",
    "geo_mean": "GMPO takes the geometric mean of sign-clipped token ratios per sequence",
}
# the routed losses under their names in core_algos (rlk's functions carry verl's names):
# bypass_mode calls vanilla and reinforce by name; user code and verl's tests call any
MODULE_LOSSES: Mapping[str, PolicyLoss] = {
    loss.__name__: loss for loss in (*POLICY_LOSSES.values(), compute_policy_loss_reinforce)}


# ---------------------------------------------------------------------------
# the KL penalty

# verl's kl_penalty names -> (kl_estimator, kl_clamp); a trailing "+" takes k2's gradient
KL_PENALTIES: Mapping[str, tuple[str, float | None]] = {
    "kl": ("k1", None), "k1": ("k1", None), "abs": ("abs", None), "mse": ("k2", None),
    "k2": ("k2", None), "low_var_kl": ("k3", 10.0), "k3": ("k3", 10.0),
}


def kl_penalty(logprob: Tensor, ref_logprob: Tensor, kl_penalty: str) -> Tensor:
    """verl's per-token KL estimate from rlk.token_kl, in the inputs' promoted dtype."""
    base = kl_penalty.removesuffix("+")
    if base not in KL_PENALTIES:
        raise UnsupportedOptionError(
            f"kl_penalty={kl_penalty!r}: rlk estimates {', '.join(map(repr, KL_PENALTIES))} "
            "(each with a '+' form); 'full' needs the whole distributions")
    if ref_logprob.requires_grad and torch.is_grad_enabled():
        raise UnsupportedOptionError(
            "kl_penalty with a ref_logprob that requires grad: rlk.token_kl differentiates "
            "logprob only")
    estimator, clamp = KL_PENALTIES[base]
    if kl_penalty.endswith("+") and estimator != "k2":  # k2's "+" form is k2 itself
        estimator += "+"
    value = rlk.token_kl(logprob, ref_logprob, kl_estimator=estimator, kl_clamp=clamp)
    return value.to(torch.promote_types(logprob.dtype, ref_logprob.dtype))


# ---------------------------------------------------------------------------
# group advantages


def _outcome_advantages(token_level_rewards: Tensor, response_mask: Tensor, index: Any,
                        **settings: Any) -> tuple[Tensor, Tensor]:
    scores = token_level_rewards.sum(dim=-1)
    advantages = rlk.group_advantages(scores, group_ids=index, mask=response_mask, **settings)
    advantages = advantages.to(scores.dtype)
    return advantages, advantages


def compute_grpo_outcome_advantage(token_level_rewards: Tensor, response_mask: Tensor,
                                   index: Any, epsilon: float = 1e-6,
                                   norm_adv_by_std_in_grpo: bool = True, config: Any = None,
                                   **_: Any) -> tuple[Tensor, Tensor]:
    """GRPO advantages (Dr. GRPO's without the std), [B, T]; a group of one keeps
    r / (1 + epsilon) (or r), as in verl."""
    return _outcome_advantages(token_level_rewards, response_mask, index,
                               normalize="std" if norm_adv_by_std_in_grpo else "none",
                               baseline="mean", eps=epsilon, singleton="reward")


def compute_rloo_outcome_advantage(token_level_rewards: Tensor, response_mask: Tensor,
                                   index: Any, epsilon: float = 1e-6, config: Any = None,
                                   **_: Any) -> tuple[Tensor, Tensor]:
    """RLOO advantages (reward minus the mean of the others); a group of one keeps r."""
    return _outcome_advantages(token_level_rewards, response_mask, index, normalize="none",
                               baseline="loo", singleton="reward")


def compute_rloo_vectorized_outcome_advantage(token_level_rewards: Tensor,
                                              response_mask: Tensor, index: Any,
                                              epsilon: float = 1e-6, config: Any = None,
                                              **_: Any) -> tuple[Tensor, Tensor]:
    """RLOO advantages as verl's vectorized variant gives them: a group of one gets 0."""
    return _outcome_advantages(token_level_rewards, response_mask, index, normalize="none",
                               baseline="loo", singleton="zero")


ESTIMATORS: Mapping[str, Callable[..., tuple[Tensor, Tensor]]] = {
    "grpo": compute_grpo_outcome_advantage,
    "grpo_vectorized": compute_grpo_outcome_advantage,
    "rloo": compute_rloo_outcome_advantage,
    "rloo_vectorized": compute_rloo_vectorized_outcome_advantage,
}
# the same estimators under their names in core_algos (verl's trainer calls
# compute_grpo_outcome_advantage by name; user code and verl's tests call any of them)
MODULE_ESTIMATORS: Mapping[str, Callable[..., tuple[Tensor, Tensor]]] = {
    "compute_grpo_outcome_advantage": compute_grpo_outcome_advantage,
    "compute_grpo_vectorized_outcome_advantage": compute_grpo_outcome_advantage,
    "compute_rloo_outcome_advantage": compute_rloo_outcome_advantage,
    "compute_rloo_vectorized_outcome_advantage": compute_rloo_vectorized_outcome_advantage,
}


# ---------------------------------------------------------------------------
# patching


def _install(patches: Patches) -> None:
    from verl.trainer.ppo import core_algos
    from verl.utils import torch_functional

    patches.swap_everywhere(torch_functional, "logprobs_from_logits", logprobs_from_logits)
    patches.swap_everywhere(torch_functional, "entropy_from_logits", entropy_from_logits)
    patches.swap_everywhere(torch_functional, "entropy_from_logits_with_chunking",
                            entropy_from_logits_with_chunking)
    for name, loss in POLICY_LOSSES.items():
        patches.swap_entry(core_algos.POLICY_LOSS_REGISTRY, name, loss)
    for name, reason in REFUSED_POLICY_LOSSES.items():
        patches.swap_entry(core_algos.POLICY_LOSS_REGISTRY, name, _refused(name, reason))
    for name, loss in MODULE_LOSSES.items():
        patches.swap_everywhere(core_algos, name, loss)
    patches.swap_everywhere(core_algos, "kl_penalty", kl_penalty)
    for name, estimator in ESTIMATORS.items():
        patches.swap_entry(core_algos.ADV_ESTIMATOR_REGISTRY, name, estimator)
    for name, estimator in MODULE_ESTIMATORS.items():
        patches.swap_everywhere(core_algos, name, estimator)


_ADAPTER = Adapter("verl", SUPPORTED, TESTED, _install)
patch = _ADAPTER.patch
unpatch = _ADAPTER.unpatch
is_patched = _ADAPTER.is_patched
patched = _ADAPTER.patched
