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
verl_algorithm = require("verl.trainer.config.algorithm")
verl_losses = require("verl.workers.utils.losses")
verl_tensordict = require("tensordict")
verl_tensordict_utils = require("verl.utils.tensordict_utils")

TOLERANCE = 1e-6
# verl's own functions, captured before any patch
VERL_LOSSES = dict(core_algos.POLICY_LOSS_REGISTRY)
VERL_ESTIMATORS = {name: core_algos.ADV_ESTIMATOR_REGISTRY[name] for name in rlk_verl.ESTIMATORS}
VERL_KL_PENALTY = core_algos.kl_penalty
VERL_FUNCTIONS = {name: getattr(torch_functional, name) for name in (
    "logprobs_from_logits", "entropy_from_logits", "entropy_from_logits_with_chunking")}
# metrics verl reports that the adapter leaves out: rlk counts GSPO's clipped sequences
# where verl averages tokens
UNREPORTED = {"gspo": {"actor/pg_clipfrac"}}


@pytest.fixture
def patched() -> Iterator[None]:
    with rlk_verl.patched():
        yield
    assert not rlk_verl.is_patched()


def actor_config(batch_info: dict | None = None, **options: Any) -> Any:
    settings: dict[str, Any] = dict(strategy="fsdp", ppo_micro_batch_size_per_gpu=2,
                                    rollout_n=1, clip_ratio=0.2)
    settings.update(options)
    if "policy_loss" in settings:  # (loss_mode, its options)
        mode, extra = settings["policy_loss"]
        settings["policy_loss"] = verl_config.PolicyLossConfig(loss_mode=mode, **extra)
    config = verl_config.ActorConfig(**settings)
    config.global_batch_info.update(batch_info or {})
    return config


def rollout(batch: int = 6, length: int = 11, seed: int = 0) -> dict[str, torch.Tensor]:
    """Log-probs far enough apart to clip and dual-clip, a short row and an empty one."""
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=gen) * 3
    new = old + torch.randn(batch, length, generator=gen) * 0.6
    new[0, :3] = old[0, :3] + 1.5  # ratio e^1.5 > clip_ratio_c = 3 with negative advantages
    new[3, 1] = old[3, 1] + 22.0  # beyond verl's ±20 log-ratio clamp
    new[4, 2] = old[4, 2] - 21.0
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


def assert_same(got: tuple, want: tuple, mode: str) -> None:
    torch.testing.assert_close(got[0], want[0], rtol=TOLERANCE, atol=TOLERANCE)
    torch.testing.assert_close(got[1], want[1], rtol=TOLERANCE, atol=TOLERANCE)
    assert set(got[2]) == set(want[2]) - UNREPORTED.get(mode, set())
    for key, value in got[2].items():
        assert value == pytest.approx(want[2][key], rel=TOLERANCE, abs=TOLERANCE), key


AGGREGATIONS = ["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum",
                "seq-mean-token-sum-norm"]
BATCH_INFO = {
    "local": {},
    "global": {"dp_size": 2, "batch_num_tokens": 57, "global_batch_size": 11},
    "scale-factor": {"loss_scale_factor": 64},
    "global-scale-factor": {"dp_size": 4, "batch_num_tokens": 101, "global_batch_size": 23,
                            "loss_scale_factor": 64},
}
MODES = {  # mode -> actor options exercising it
    "vanilla": [{}, {"clip_ratio_low": 0.1, "clip_ratio_high": 0.28, "clip_ratio_c": 2.5}],
    "gspo": [{"clip_ratio_low": 0.05, "clip_ratio_high": 0.08}],
    "sapo": [{"tau_pos": 1.3, "tau_neg": 0.7}],
    "cispo": [{"clip_ratio_low": 0.4, "clip_ratio_high": 0.3}],
    "gpg": [{}],
    "dro": [{"policy_loss": ("dro", {"dro_beta": 0.3})}],
}
POLICY_CASES = [
    pytest.param(mode, options, agg, info, weighted,
                 id=f"{mode}{index}-{agg}-{info}-{'is' if weighted else 'no-is'}")
    for mode, variants in MODES.items() for index, options in enumerate(variants)
    for agg in AGGREGATIONS for info in BATCH_INFO
    for weighted in ((False,) if mode == "dro" else (False, True))
]


@pytest.mark.parametrize("mode", list(MODES))
def test_nan_log_probs_at_padding(patched: None, mode: str) -> None:
    """Log-probs NaN where the response mask is 0 (padding a scorer left unfilled) change
    nothing: the loss, the gradient at real tokens and every metric are verl's on the
    same inputs with 0 at the padding; and every value verl itself keeps finite with the
    NaNs (actor/ppo_kl among them) is rlk's (vanilla and cispo; verl's GSPO and SAPO
    losses turn NaN)."""
    clean = rollout(seed=3)
    clean["rollout_is_weights"] = None
    padding = clean["response_mask"] == 0
    poisoned = {name: value.masked_fill(padding, float("nan"))
                if name in ("log_prob", "old_log_prob") else value
                for name, value in clean.items()}
    call = dict(loss_agg_mode="token-mean", config=actor_config(**MODES[mode][0]))
    want = loss_and_grad(VERL_LOSSES[mode], clean, **call)
    verl_poisoned = loss_and_grad(VERL_LOSSES[mode], poisoned, **call)
    got = loss_and_grad(core_algos.get_policy_loss_fn(mode), poisoned, **call)
    keep = ~padding
    torch.testing.assert_close(got[0], want[0], rtol=TOLERANCE, atol=TOLERANCE)
    torch.testing.assert_close(got[1][keep], want[1][keep], rtol=TOLERANCE, atol=TOLERANCE)
    assert set(got[2]) == set(want[2]) - UNREPORTED.get(mode, set())
    for key, value in got[2].items():
        assert value == pytest.approx(want[2][key], rel=TOLERANCE, abs=TOLERANCE), key
        if np.isfinite(verl_poisoned[2][key]):
            assert value == pytest.approx(verl_poisoned[2][key], rel=TOLERANCE,
                                          abs=TOLERANCE), key
    if torch.isfinite(verl_poisoned[0]):
        torch.testing.assert_close(got[0], verl_poisoned[0], rtol=TOLERANCE, atol=TOLERANCE)
    assert ("actor/ppo_kl" in got[2]) == (mode not in ("gpg",))


def test_every_verl_policy_loss_is_routed_or_refused() -> None:
    assert set(MODES) == set(rlk_verl.POLICY_LOSSES)
    classified = {*rlk_verl.POLICY_LOSSES, *rlk_verl.REFUSED_POLICY_LOSSES, "bypass_mode"}
    assert classified == set(VERL_LOSSES)  # bypass_mode: verl's, over the module losses


@pytest.mark.parametrize(("mode", "options", "agg", "info", "weighted"), POLICY_CASES)
def test_policy_losses_match_verl(patched: None, mode: str, options: dict, agg: str,
                                  info: str, weighted: bool) -> None:
    inputs = rollout()
    if not weighted:
        inputs["rollout_is_weights"] = None
    call = dict(loss_agg_mode=agg, config=actor_config(BATCH_INFO[info], **options))
    want = loss_and_grad(VERL_LOSSES[mode], inputs, **call)
    routed = core_algos.get_policy_loss_fn(mode)
    assert routed is rlk_verl.POLICY_LOSSES[mode]
    assert_same(loss_and_grad(routed, inputs, **call), want, mode)
    if mode == "vanilla":  # the inputs clip and dual-clip
        assert want[2]["actor/pg_clipfrac"] > 0 and want[2]["actor/pg_clipfrac_lower"] > 0


@pytest.mark.parametrize("loss_type", ["ppo_clip", "reinforce"])
@pytest.mark.parametrize("rollout_is", ["token", "sequence", None])
def test_bypass_mode_runs_rlk_with_verl_corrections(loss_type: str,
                                                    rollout_is: str | None) -> None:
    """bypass_mode stays verl's (its IS weights and rejection mask), over rlk's losses."""
    correction = verl_algorithm.RolloutCorrectionConfig(
        rollout_is=rollout_is, rollout_is_threshold=1.5, loss_type=loss_type, bypass_mode=True)
    config = actor_config(policy_loss=("bypass_mode", {"rollout_correction": correction}))
    inputs = {**rollout(), "rollout_is_weights": None}
    call = dict(loss_agg_mode="seq-mean-token-sum", config=config)
    want = loss_and_grad(VERL_LOSSES["bypass_mode"], inputs, **call)
    with rlk_verl.patched():
        assert core_algos.compute_policy_loss_vanilla is rlk_verl.compute_policy_loss_vanilla
        got = loss_and_grad(core_algos.get_policy_loss_fn("bypass_mode"), inputs, **call)
    assert_same(got, want, "bypass_mode")


@pytest.mark.parametrize("mode", sorted(rlk_verl.REFUSED_POLICY_LOSSES))
def test_inexpressible_policy_losses_raise(patched: None, mode: str) -> None:
    with pytest.raises(UnsupportedOptionError, match=f"loss_mode={mode!r}"):
        core_algos.get_policy_loss_fn(mode)(**rollout(), config=actor_config())


def test_dro_with_rollout_weights_raises(patched: None) -> None:
    config = actor_config(policy_loss=("dro", {"dro_beta": 0.3}))
    with pytest.raises(UnsupportedOptionError, match="rollout_is_weights"):
        core_algos.get_policy_loss_fn("dro")(**rollout(), config=config)


def test_a_missing_global_count_raises_as_in_verl(patched: None) -> None:
    config = actor_config({"dp_size": 2})
    with pytest.raises(ValueError, match="batch_num_tokens"):
        core_algos.get_policy_loss_fn("vanilla")(**rollout(), loss_agg_mode="token-mean",
                                                 config=config)


def actor_batch(seed: int = 1) -> tuple[Any, torch.Tensor]:
    """verl's actor inputs: a TensorDict of padded prompts and responses (one response
    empty), and the policy's log-probs as the model returns them, one flat row per token."""
    gen = torch.Generator().manual_seed(seed)
    batch, prompt, response = 5, 3, 6
    lengths = torch.tensor([6, 3, 5, 1, 4])
    response_mask = (torch.arange(response)[None] < lengths[:, None]).long()
    old = -torch.rand(batch, response, generator=gen) * 3
    new = old + torch.randn(batch, response, generator=gen) * 0.5
    data = verl_tensordict.TensorDict({
        "prompts": torch.randint(3, 20, (batch, prompt), generator=gen),
        "responses": torch.randint(3, 20, (batch, response), generator=gen),
        "attention_mask": torch.cat([torch.ones(batch, prompt, dtype=torch.long),
                                     response_mask], dim=1),
        "response_mask": response_mask, "old_log_probs": old,
        "advantages": torch.randn(batch, 1, generator=gen).expand(batch, response).clone(),
        "ref_log_prob": old + torch.randn(batch, response, generator=gen) * 0.5,
    }, batch_size=[batch])
    verl_tensordict_utils.assign_non_tensor(data, dp_size=1, batch_num_tokens=None,
                                            global_batch_size=None)
    # row i's response log-probs sit at positions prompt - 1 ... of its unpadded sequence
    rows = [torch.cat([torch.zeros(prompt - 1), new[i, :int(n)], torch.zeros(1)])
            for i, n in enumerate(lengths)]
    return data, torch.cat(rows)


def actor_loss(data: Any, flat_log_probs: torch.Tensor, **options: Any):
    leaf = flat_log_probs.clone().requires_grad_(True)
    config = actor_config(use_kl_loss=True, kl_loss_coef=0.1, **options)
    loss, metrics = verl_losses.ppo_loss(config, {"log_probs": leaf}, data)
    (grad,) = torch.autograd.grad(loss, leaf)
    values = {key: metric.values if hasattr(metric, "values") else metric
              for key, metric in metrics.items()}
    return loss.detach(), grad, values


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("kl_loss_type", ["low_var_kl", "k3+", "mse"])
@pytest.mark.parametrize("mode", ["vanilla", "sapo", "gspo"])
def test_the_actor_loss_matches_verl(mode: str, kl_loss_type: str, agg: str) -> None:
    """verl's ppo_loss (policy loss + kl_loss_coef times the aggregated kl_penalty), whole.

    sapo aggregates its policy term seq-mean-token-mean while verl aggregates the KL with
    loss_agg_mode: the two are routed separately, as verl computes them, so the sum is exact.
    """
    data, log_probs = actor_batch()
    options = dict(policy_loss=(mode, {}), kl_loss_type=kl_loss_type, loss_agg_mode=agg)
    want = actor_loss(data, log_probs, **options)
    with rlk_verl.patched():
        got = actor_loss(data, log_probs, **options)
    torch.testing.assert_close(got[0], want[0], rtol=TOLERANCE, atol=TOLERANCE)
    torch.testing.assert_close(got[1], want[1], rtol=TOLERANCE, atol=TOLERANCE)
    assert set(got[2]) == set(want[2]) - UNREPORTED.get(mode, set())
    for key in ("actor/pg_loss", "kl_loss"):
        torch.testing.assert_close(torch.as_tensor(got[2][key]), torch.as_tensor(want[2][key]),
                                   rtol=TOLERANCE, atol=TOLERANCE)


KL_NAMES = [*rlk_verl.KL_PENALTIES, *(f"{name}+" for name in rlk_verl.KL_PENALTIES)]


@pytest.mark.parametrize("name", KL_NAMES)
def test_kl_penalty_matches_verl(patched: None, name: str) -> None:
    inputs = rollout()
    ref, logprob = inputs["old_log_prob"], inputs["log_prob"]  # deltas up to ±22
    leaf = logprob.clone().requires_grad_(True)
    want = VERL_KL_PENALTY(leaf, ref, name)
    upstream = torch.rand(want.shape, generator=torch.Generator().manual_seed(5))
    (want_grad,) = torch.autograd.grad(want, leaf, upstream)
    leaf = logprob.clone().requires_grad_(True)
    got = core_algos.kl_penalty(leaf, ref, kl_penalty=name)
    (got_grad,) = torch.autograd.grad(got, leaf, upstream)
    assert got.dtype == want.dtype
    finite = want.detach().abs() < 1e6  # k1/k2/abs at delta 22 are large but finite in both
    torch.testing.assert_close(got.detach()[finite], want.detach()[finite], rtol=TOLERANCE,
                               atol=TOLERANCE)
    torch.testing.assert_close(got_grad, want_grad, rtol=TOLERANCE, atol=TOLERANCE)


@pytest.mark.parametrize(("name", "message"), [("full", "whole distributions"),
                                               ("k4", "kl_penalty='k4'")])
def test_kl_penalties_rlk_cannot_estimate_raise(patched: None, name: str, message: str) -> None:
    inputs = rollout()
    with pytest.raises(UnsupportedOptionError, match=message):
        core_algos.kl_penalty(inputs["log_prob"], inputs["old_log_prob"], name)


def test_kl_penalty_refuses_a_differentiable_reference(patched: None) -> None:
    inputs = rollout()
    with pytest.raises(UnsupportedOptionError, match="requires grad"):
        core_algos.kl_penalty(inputs["log_prob"], inputs["old_log_prob"].requires_grad_(True),
                              "low_var_kl")


def test_the_actor_imports_the_routed_kl_penalty(patched: None) -> None:
    losses = require("verl.workers.utils.losses")
    assert losses.kl_penalty is rlk_verl.kl_penalty


def rewards_and_groups(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Outcome rewards on the last real token, groups of 1-5 named by uid strings, shuffled."""
    gen = torch.Generator().manual_seed(seed)
    sizes = [4, 2, 5, 3, 4, 1]
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
    rewards[uids == "uid-5", last[uids == "uid-5"]] = 2.0  # a group of one
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
    alone = uids == "uid-5"
    assert bool((want != 0).any()) and bool((want[alone] != 0).any()) == (
        name != "rloo_vectorized")


def test_routed_functions_are_routed_by_name_too(patched: None) -> None:
    """verl's ray_trainer calls compute_grpo_outcome_advantage by name, bypass_mode the
    vanilla and REINFORCE losses; each routed estimator and loss is also rlk's under its
    core_algos name, the same function as its registry entry."""
    for name, function in {**rlk_verl.MODULE_ESTIMATORS, **rlk_verl.MODULE_LOSSES}.items():
        assert getattr(core_algos, name) is function, name
    for mode, loss in rlk_verl.POLICY_LOSSES.items():
        assert rlk_verl.MODULE_LOSSES[VERL_LOSSES[mode].__name__] is loss
    for name, estimator in rlk_verl.ESTIMATORS.items():
        assert rlk_verl.MODULE_ESTIMATORS[VERL_ESTIMATORS[name].__name__] is estimator


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("shape", [(5, 33), (2, 4, 33)])
def test_logprobs_from_logits_matches_verl(patched: None, shape: tuple[int, ...],
                                           dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(*shape, generator=gen) * 4).to(dtype).requires_grad_(True)
    labels = torch.randint(0, shape[-1], shape[:-1], generator=gen)
    want = VERL_FUNCTIONS["logprobs_from_logits"](logits, labels)
    (want_grad,) = torch.autograd.grad(want.sum(), logits)
    got = torch_functional.logprobs_from_logits(logits, labels)
    (got_grad,) = torch.autograd.grad(got.sum(), logits)
    assert got.dtype == want.dtype == dtype
    tolerance = 2e-2 if dtype == torch.bfloat16 else TOLERANCE  # verl's bf16 log_softmax rounds
    torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(got_grad, want_grad, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("name", ["entropy_from_logits", "entropy_from_logits_with_chunking"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_entropy_matches_verl(patched: None, name: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(4)
    logits = (torch.randn(9, 41, generator=gen) * 3).to(dtype).requires_grad_(True)
    want = VERL_FUNCTIONS[name](logits)
    (want_grad,) = torch.autograd.grad(want.sum(), logits)
    got = getattr(torch_functional, name)(logits)
    (got_grad,) = torch.autograd.grad(got.sum(), logits)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=TOLERANCE, atol=TOLERANCE)
    torch.testing.assert_close(got_grad, want_grad, rtol=TOLERANCE, atol=TOLERANCE)


def test_unpatch_restores_verl() -> None:
    importer = require("verl.workers.rollout.naive.naive_rollout")
    losses = require("verl.workers.utils.losses")
    with rlk_verl.patched():
        assert importer.logprobs_from_logits is rlk_verl.logprobs_from_logits
    assert importer.logprobs_from_logits is VERL_FUNCTIONS["logprobs_from_logits"]
    for name, function in VERL_FUNCTIONS.items():
        assert getattr(torch_functional, name) is function
    assert core_algos.POLICY_LOSS_REGISTRY == VERL_LOSSES
    assert core_algos.kl_penalty is losses.kl_penalty is VERL_KL_PENALTY
    assert core_algos.compute_policy_loss_vanilla is VERL_LOSSES["vanilla"]
    assert all(core_algos.ADV_ESTIMATOR_REGISTRY[name] is fn
               for name, fn in VERL_ESTIMATORS.items())
