"""rlk inside verl: `patch()` routes verl's log-probs, PPO loss and group advantages to rlk.

    from rlk.integrations import verl as rlk_verl
    rlk_verl.patch()          # or: with rlk_verl.patched(): ...

What is routed (docs/integrations/verl.md has the option table):
- `verl.utils.torch_functional.logprobs_from_logits` -> `rlk.logp`, in the logits' dtype;
- the policy-loss registry's "vanilla" entry (PPO clip with dual-clip) -> `rlk.policy_loss`;
- the "grpo", "grpo_vectorized", "rloo" and "rloo_vectorized" advantage estimators
  (and `compute_grpo_outcome_advantage`, which verl's trainer calls by name) ->
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

# verl loss_agg_mode -> rlk aggregation, for the modes whose normaliser rlk has
AGGREGATIONS = {"token-mean": "token-mean", "seq-mean-token-mean": "seq-mean-token-mean",
                "seq-mean-token-sum": "seq-mean-token-sum"}


# ---------------------------------------------------------------------------
# log-probabilities


def logprobs_from_logits(logits: Tensor, labels: Tensor, inplace_backward: bool = True) -> Tensor:
    """log-softmax(logits) at `labels`, in the logits' dtype (verl's contract).

    `inplace_backward` is accepted for verl's signature: rlk's backward never
    overwrites the logits.
    """
    return rlk.logp(logits, labels).to(logits.dtype)


# ---------------------------------------------------------------------------
# the policy loss


def _config_value(config: Any, name: str, default: Any = None) -> Any:
    getter = getattr(config, "get", None)
    return getter(name, default) if getter is not None else getattr(config, name, default)


def vanilla_policy_options(config: Any, loss_agg_mode: str) -> dict[str, Any]:
    """rlk.policy_loss options for verl's "vanilla" loss under an ActorConfig."""
    if loss_agg_mode not in AGGREGATIONS:
        raise UnsupportedOptionError(
            f"loss_agg_mode={loss_agg_mode!r}: rlk.policy_loss has no such normaliser yet "
            f"(supported: {', '.join(map(repr, AGGREGATIONS))})")
    batch_info = {key: value for key, value in
                  dict(_config_value(config, "global_batch_info", None) or {}).items()
                  if value is not None and not (key == "dp_size" and value == 1)}
    if batch_info:
        raise UnsupportedOptionError(
            f"global_batch_info={batch_info}: rlk.policy_loss has no global token or "
            "sequence count yet")
    clip = _config_value(config, "clip_ratio")
    low = _config_value(config, "clip_ratio_low")
    high = _config_value(config, "clip_ratio_high")
    return dict(clip_low=clip if low is None else low, clip_high=clip if high is None else high,
                dual_clip=_config_value(config, "clip_ratio_c", 3.0),
                agg=AGGREGATIONS[loss_agg_mode])


def compute_policy_loss_vanilla(old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor,
                                response_mask: Tensor, loss_agg_mode: str = "token-mean",
                                config: Any = None, rollout_is_weights: Tensor | None = None,
                                ) -> tuple[Tensor, dict[str, Any]]:
    """verl's "vanilla" PPO loss (clip, dual-clip at clip_ratio_c) from rlk.policy_loss.

    verl multiplies each token's policy term by `rollout_is_weights` (detached, >= 0);
    the term is positively homogeneous in the advantage, so the weights scale the
    advantages instead.
    """
    if config is None:
        raise ValueError("verl's vanilla policy loss needs the actor config")
    options = vanilla_policy_options(config, loss_agg_mode)
    if rollout_is_weights is not None:
        advantages = advantages * rollout_is_weights.detach()
    loss, metrics = rlk.policy_loss(log_prob, old_log_prob, advantages, response_mask != 0,
                                    **options)
    return loss, {"actor/pg_clipfrac": metrics["clip_fraction"].item(),
                  "actor/ppo_kl": _mean_log_ratio(old_log_prob, log_prob, response_mask)}


def _mean_log_ratio(old_log_prob: Tensor, log_prob: Tensor, mask: Tensor) -> float:
    """verl's `ppo_kl` diagnostic, the token mean of log(old / new); rlk reports the ratio."""
    keep = mask != 0
    return float((old_log_prob - log_prob.detach())[keep].mean()) if bool(keep.any()) else 0.0


# ---------------------------------------------------------------------------
# group advantages


def _group_ids(index: Any, device: torch.device) -> Tensor:
    """verl's group labels (a NumPy array of uid strings, or integers) as int64 ids."""
    labels = list(index.tolist() if hasattr(index, "tolist") else index)
    ids: dict[Any, int] = {}
    return torch.tensor([ids.setdefault(label, len(ids)) for label in labels],
                        dtype=torch.int64, device=device)


def _outcome_advantages(token_level_rewards: Tensor, response_mask: Tensor, index: Any, *,
                        normalize: str, baseline: str, epsilon: float,
                        ) -> tuple[Tensor, Tensor]:
    scores = token_level_rewards.sum(dim=-1)
    group_ids = _group_ids(index, scores.device)
    sizes = torch.bincount(group_ids)
    if bool((sizes == 1).any()):
        raise UnsupportedOptionError(
            "a group of one response: verl gives it r/(1+epsilon) (GRPO) or r (RLOO), "
            "rlk.group_advantages gives 0")
    advantages = rlk.group_advantages(scores, group_ids=group_ids, normalize=normalize,
                                      baseline=baseline, eps=epsilon)
    advantages = advantages.to(scores.dtype).unsqueeze(-1) * response_mask
    return advantages, advantages


def compute_grpo_outcome_advantage(token_level_rewards: Tensor, response_mask: Tensor,
                                   index: Any, epsilon: float = 1e-6,
                                   norm_adv_by_std_in_grpo: bool = True, config: Any = None,
                                   **_: Any) -> tuple[Tensor, Tensor]:
    """GRPO advantages (or Dr. GRPO's, without the std) from rlk.group_advantages, [B, T]."""
    return _outcome_advantages(token_level_rewards, response_mask, index,
                               normalize="std" if norm_adv_by_std_in_grpo else "none",
                               baseline="mean", epsilon=epsilon)


def compute_rloo_outcome_advantage(token_level_rewards: Tensor, response_mask: Tensor,
                                   index: Any, epsilon: float = 1e-6, config: Any = None,
                                   **_: Any) -> tuple[Tensor, Tensor]:
    """RLOO advantages (reward minus the mean of the others) from rlk.group_advantages."""
    return _outcome_advantages(token_level_rewards, response_mask, index, normalize="none",
                               baseline="loo", epsilon=epsilon)


ESTIMATORS: Mapping[str, Callable[..., tuple[Tensor, Tensor]]] = {
    "grpo": compute_grpo_outcome_advantage,
    "grpo_vectorized": compute_grpo_outcome_advantage,
    "rloo": compute_rloo_outcome_advantage,
    "rloo_vectorized": compute_rloo_outcome_advantage,
}
POLICY_LOSSES: Mapping[str, Callable[..., tuple[Tensor, dict[str, Any]]]] = {
    "vanilla": compute_policy_loss_vanilla,
}


# ---------------------------------------------------------------------------
# patching


def _install(patches: Patches) -> None:
    from verl.trainer.ppo import core_algos
    from verl.utils import torch_functional

    patches.swap_everywhere(torch_functional, "logprobs_from_logits", logprobs_from_logits)
    for name, loss in POLICY_LOSSES.items():
        patches.swap_entry(core_algos.POLICY_LOSS_REGISTRY, name, loss)
    for name, estimator in ESTIMATORS.items():
        patches.swap_entry(core_algos.ADV_ESTIMATOR_REGISTRY, name, estimator)
    patches.swap_everywhere(core_algos, "compute_grpo_outcome_advantage",
                            compute_grpo_outcome_advantage)


_ADAPTER = Adapter("verl", SUPPORTED, TESTED, _install)
patch = _ADAPTER.patch
unpatch = _ADAPTER.unpatch
is_patched = _ADAPTER.is_patched
patched = _ADAPTER.patched
