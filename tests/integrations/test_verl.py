"""rlk.integrations.verl against verl itself: each routed function beside verl's own.

verl 0.9.1's loss module imports without its heavy dependencies (no vLLM, no
flash-attn, no Megatron), so verl's functions, captured before patching, are the
oracle: values, gradients and metrics within 1e-6 on random data.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from rlk.integrations import UnsupportedOptionError
from rlk.integrations import verl as rlk_verl

from .conftest import require

core_algos = require("verl.trainer.ppo.core_algos")
torch_functional = require("verl.utils.torch_functional")
verl_config = require("verl.workers.config")

TOLERANCE = 1e-6
VERL_LOSS_VANILLA = core_algos.POLICY_LOSS_REGISTRY["vanilla"]
VERL_ESTIMATORS = {name: core_algos.ADV_ESTIMATOR_REGISTRY[name]
                   for name in rlk_verl.ESTIMATORS}
VERL_LOGPROBS = torch_functional.logprobs_from_logits


@pytest.fixture
def patched() -> Iterator[None]:
    with rlk_verl.patched():
        yield
    assert not rlk_verl.is_patched()


def actor_config(**options: Any) -> Any:
    settings: dict[str, Any] = dict(strategy="fsdp", ppo_micro_batch_size_per_gpu=2,
                                    rollout_n=1, clip_ratio=0.2)
    settings.update(options)
    return verl_config.ActorConfig(**settings)


def rollout(batch: int = 6, length: int = 11, seed: int = 0) -> dict[str, torch.Tensor]:
    """Log-probs far enough apart to clip and dual-clip, a short row and an empty one."""
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=gen) * 3
    new = old + torch.randn(batch, length, generator=gen) * 0.6
    new[0, :3] = old[0, :3] + 1.5  # ratio e^1.5 > clip_ratio_c = 3 with negative advantages
    mask = (torch.rand(batch, length, generator=gen) > 0.2).to(torch.int64)
    mask[1, 4:] = 0
    mask[2] = 0
    advantages = torch.randn(batch, 1, generator=gen).expand(batch, length).clone()
    advantages[0] = -1.0
    return {"old_log_prob": old, "log_prob": new, "advantages": advantages,
            "response_mask": mask,
            "rollout_is_weights": torch.rand(batch, length, generator=gen) * 2}


def loss_and_grad(loss_fn: Any, inputs: dict[str, torch.Tensor], **options: Any):
    log_prob = inputs["log_prob"].clone().requires_grad_(True)
    loss, metrics = loss_fn(**{**inputs, "log_prob": log_prob}, **options)
    (grad,) = torch.autograd.grad(loss, log_prob)
    return loss.detach(), grad, metrics


@pytest.mark.parametrize("loss_agg_mode", list(rlk_verl.AGGREGATIONS))
@pytest.mark.parametrize("weighted", [False, True], ids=["no-is-weights", "is-weights"])
@pytest.mark.parametrize("clips", [dict(), dict(clip_ratio_low=0.1, clip_ratio_high=0.28,
                                                clip_ratio_c=2.5)], ids=["default", "dapo"])
def test_vanilla_policy_loss_matches_verl(patched: None, loss_agg_mode: str, weighted: bool,
                                          clips: dict) -> None:
    inputs = rollout()
    if not weighted:
        inputs["rollout_is_weights"] = None
    options = dict(loss_agg_mode=loss_agg_mode, config=actor_config(**clips))
    want = loss_and_grad(VERL_LOSS_VANILLA, inputs, **options)
    routed = core_algos.get_policy_loss_fn("vanilla")
    assert routed is rlk_verl.compute_policy_loss_vanilla
    got = loss_and_grad(routed, inputs, **options)
    torch.testing.assert_close(got[0], want[0], rtol=TOLERANCE, atol=TOLERANCE)
    torch.testing.assert_close(got[1], want[1], rtol=TOLERANCE, atol=TOLERANCE)
    for key in ("actor/pg_clipfrac", "actor/ppo_kl"):
        assert got[2][key] == pytest.approx(want[2][key], rel=TOLERANCE, abs=TOLERANCE), key
    assert want[2]["actor/pg_clipfrac"] > 0 and want[2]["actor/pg_clipfrac_lower"] > 0


@pytest.mark.parametrize(("mode", "config", "message"), [
    ("token-sum", {}, "loss_agg_mode='token-sum'"),
    ("seq-mean-token-sum-norm", {}, "loss_agg_mode='seq-mean-token-sum-norm'"),
    ("token-mean", {"global_batch_info": {"batch_num_tokens": 40}}, "global_batch_info"),
])
def test_vanilla_refuses_what_rlk_cannot_express(patched: None, mode: str, config: dict,
                                                 message: str) -> None:
    actor = actor_config()
    actor.global_batch_info.update(config.get("global_batch_info", {}))
    with pytest.raises(UnsupportedOptionError, match=message):
        core_algos.get_policy_loss_fn("vanilla")(**rollout(), loss_agg_mode=mode, config=actor)


def rewards_and_groups(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Outcome rewards on the last real token, groups of 2-5 named by uid strings, shuffled."""
    gen = torch.Generator().manual_seed(seed)
    sizes = [4, 2, 5, 3, 4]
    uids = np.array([f"uid-{g}" for g, size in enumerate(sizes) for _ in range(size)],
                    dtype=object)
    order = torch.randperm(len(uids), generator=gen).numpy()
    uids = uids[order]
    batch, length = len(uids), 7
    mask = torch.ones(batch, length)
    for row in range(batch):
        mask[row, int(torch.randint(1, length + 1, (), generator=gen)):] = 0
    rewards = torch.zeros(batch, length)
    last = mask.sum(-1).long() - 1
    rewards[torch.arange(batch), last] = torch.randint(0, 3, (batch,), generator=gen).float()
    rewards[uids == "uid-3", last[uids == "uid-3"]] = 1.0  # a constant group
    return rewards, mask, uids


ESTIMATOR_CASES = [
    *(pytest.param(name, dict(norm_adv_by_std_in_grpo=norm), id=f"{name}-std{norm}")
      for name in ("grpo", "grpo_vectorized") for norm in (True, False)),
    *(pytest.param(name, {}, id=name) for name in ("rloo", "rloo_vectorized")),
]


def test_every_routed_estimator_is_tested() -> None:
    assert {case.values[0] for case in ESTIMATOR_CASES} == set(rlk_verl.ESTIMATORS)


@pytest.mark.parametrize(("name", "options"), ESTIMATOR_CASES)
def test_advantage_estimators_match_verl(patched: None, name: str, options: dict) -> None:
    rewards, mask, uids = rewards_and_groups()
    options = dict(options, epsilon=1e-6)
    want, want_returns = VERL_ESTIMATORS[name](rewards, mask, uids, **options)
    got, got_returns = core_algos.get_adv_estimator_fn(name)(rewards, mask, uids, **options)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=TOLERANCE, atol=TOLERANCE)
    torch.testing.assert_close(got_returns, want_returns, rtol=TOLERANCE, atol=TOLERANCE)
    assert bool((want != 0).any())


def test_trainer_calls_grpo_by_name(patched: None) -> None:
    # verl's ray_trainer.compute_advantage calls core_algos.compute_grpo_outcome_advantage
    assert core_algos.compute_grpo_outcome_advantage is rlk_verl.compute_grpo_outcome_advantage


def test_groups_of_one_are_refused(patched: None) -> None:
    rewards, mask, uids = rewards_and_groups()
    uids[0] = "alone"
    with pytest.raises(UnsupportedOptionError, match="group of one"):
        core_algos.get_adv_estimator_fn("grpo")(rewards, mask, uids)


@pytest.mark.parametrize("shape", [(5, 33), (2, 4, 33)])
def test_logprobs_from_logits_matches_verl(patched: None, shape: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(*shape, generator=gen) * 4).requires_grad_(True)
    labels = torch.randint(0, shape[-1], shape[:-1], generator=gen)
    want = VERL_LOGPROBS(logits, labels)
    (want_grad,) = torch.autograd.grad(want.sum(), logits)
    got = torch_functional.logprobs_from_logits(logits, labels)
    (got_grad,) = torch.autograd.grad(got.sum(), logits)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=TOLERANCE, atol=TOLERANCE)
    torch.testing.assert_close(got_grad, want_grad, rtol=TOLERANCE, atol=TOLERANCE)


def test_unpatch_restores_verl() -> None:
    importer = require("verl.workers.rollout.naive.naive_rollout")
    with rlk_verl.patched():
        assert importer.logprobs_from_logits is rlk_verl.logprobs_from_logits
    assert importer.logprobs_from_logits is VERL_LOGPROBS
    assert torch_functional.logprobs_from_logits is VERL_LOGPROBS
    assert core_algos.POLICY_LOSS_REGISTRY["vanilla"] is VERL_LOSS_VANILLA
    assert all(core_algos.ADV_ESTIMATOR_REGISTRY[name] is fn
               for name, fn in VERL_ESTIMATORS.items())
