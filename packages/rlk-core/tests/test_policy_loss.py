"""The public policy_loss: options, inputs, gradients, metrics, errors, compile, eager path."""

from __future__ import annotations

import dataclasses
import inspect
import math

import fake_plugins
import numpy as np
import pytest
import torch

import rlk
from rlk.dispatch import captured_policy
from rlk.ops.policy_loss import native as native_policy_loss
from rlk.ops.policy_loss import reference
from rlk.ops.policy_loss.op import POLICY_LOSS
from rlk.ops.policy_loss.options import METRICS, PolicyLossOptions
from rlk.testing.compare import assert_matches

GEN = torch.Generator().manual_seed(3)
B, T = 5, 8


def _batch(spread: float = 0.3):
    logp = -torch.rand(B, T, generator=GEN) * 3
    old = logp + torch.randn(B, T, generator=GEN) * spread
    mask = torch.rand(B, T, generator=GEN) > 0.3
    mask[:, 0] = True
    advantages = torch.randn(B, generator=GEN)
    return logp, old, advantages, mask


def _companions():
    logp, old, advantages, mask = _batch()
    ref = logp + torch.randn(B, T, generator=GEN) * 0.2
    rollout = old + torch.randn(B, T, generator=GEN) * 0.4
    return logp, old, advantages, mask, ref, rollout


def _close(actual, expected, atol=1e-5, rtol=1e-5):
    torch.testing.assert_close(actual.double(), expected.double(), atol=atol, rtol=rtol,
                               equal_nan=True)


def _reference_with_grad(logp, *tensors, **kwargs):
    leaf = logp.detach().double().requires_grad_(True)
    loss, metrics = reference.policy_loss(leaf, *tensors, **kwargs)
    (grad,) = torch.autograd.grad(loss, leaf)
    return loss, metrics, grad


# every option at least once; the conformance samples cover the combinations
SETTINGS = {
    "ppo": {},
    "dual-clip": {"dual_clip": 3.0},
    "delta": {"ratio_cap": 1.3, "clip_high": 0.28},
    "gspo": {"ratio_level": "sequence", "clip_low": 3e-4, "clip_high": 4e-4,
             "agg": "seq-mean-token-mean"},
    "gspo-token": {"ratio_level": "sequence-token", "log_ratio_max": 10.0},
    "verl-clamp": {"log_ratio_min": -20.0, "log_ratio_max": 20.0},
    "cispo": {"objective": "cispo", "clip_low": 1.0, "clip_high": 4.0},
    "sapo": {"objective": "sapo", "agg": "seq-mean-token-mean"},
    "vespo": {"objective": "vespo", "vespo_k_pos": 1.5},
    "k1": {"kl_coef": 0.1, "kl_estimator": "k1"},
    "k2": {"kl_coef": 0.1, "kl_estimator": "k2"},
    "k3-clamped": {"kl_coef": 0.1, "kl_estimator": "k3", "kl_clamp": 0.02},
    "k3+": {"kl_coef": 0.1, "kl_estimator": "k3+"},
    "abs": {"kl_coef": 0.1, "kl_estimator": "abs"},
    "abs+": {"kl_coef": 0.1, "kl_estimator": "abs+"},
    "k1+": {"kl_coef": 0.1, "kl_estimator": "k1+"},
    "bias-corrected": {"kl_coef": 0.04, "kl_bias_correction": True},
    "tis": {"tis_cap": 1.5},
    "token-sum": {"agg": "token-sum", "scale": 0.5},
    "seq-sum-empty-rows": {"agg": "seq-mean-token-sum", "count_empty_rows": True},
    "norm": {"agg": "seq-mean-token-sum-norm"},
    "divisor": {"divisor": 123.0},
}


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_loss_metrics_and_gradient_match_reference(name):
    settings = SETTINGS[name]
    logp, old, advantages, mask, ref, rollout = _companions()
    mask[2] = False  # an empty sequence
    extra = {"ref_logp": ref, "rollout_logp": rollout}
    leaf = logp.clone().requires_grad_(True)
    loss, metrics = rlk.policy_loss(leaf, old, advantages, mask, **extra, **settings)
    assert loss.shape == () and loss.dtype == torch.float32
    assert list(metrics) == list(METRICS)
    assert all(not value.requires_grad and value.shape == () for value in metrics.values())
    loss.backward()
    want_loss, want_metrics, want_grad = _reference_with_grad(
        logp, old, advantages, mask, **extra, options=PolicyLossOptions(**settings))
    _close(loss, want_loss)
    _close(leaf.grad, want_grad, atol=1e-6)
    _close(torch.stack(list(metrics.values())), want_metrics)
    assert torch.equal(leaf.grad[~mask], torch.zeros(int((~mask).sum())))


def test_every_option_changes_the_result_somewhere():
    """Guards against an option being silently ignored by the op."""
    logp, old, advantages, mask, ref, rollout = _companions()
    old[0] = logp[0] - 1.0  # ratios e, beyond every clip bound below
    advantages[0] = -2.0
    kwargs = {"ref_logp": ref, "rollout_logp": rollout}
    base = {"kl_coef": 0.1, "tis_cap": 10.0}
    changed = {"objective": "sapo", "clip_low": 0.1, "clip_high": 0.5, "dual_clip": 2.0,
               "ratio_cap": 1.5, "ratio_level": "sequence", "log_ratio_min": -0.05,
               "log_ratio_max": 0.5, "kl_coef": 0.2, "kl_estimator": "k2", "kl_clamp": 0.01,
               "kl_bias_correction": True, "tis_cap": 0.5, "agg": "token-sum",
               "divisor": 3.0, "scale": 2.0}
    leaf = logp.clone().requires_grad_(True)
    loss, _ = rlk.policy_loss(leaf, old, advantages, mask, **kwargs, **base)
    (grad,) = torch.autograd.grad(loss, leaf)
    for name, value in changed.items():
        other = logp.clone().requires_grad_(True)
        new_loss, _ = rlk.policy_loss(other, old, advantages, mask, **kwargs,
                                      **{**base, name: value})
        (new_grad,) = torch.autograd.grad(new_loss, other)
        assert new_loss != loss or not torch.equal(new_grad, grad), name
    by_objective = {"sapo": {"sapo_temperature_pos": 3.0, "sapo_temperature_neg": 0.5},
                    "vespo": {"vespo_k_pos": 0.5, "vespo_lambda_pos": 1.0, "vespo_k_neg": 1.0,
                              "vespo_lambda_neg": 0.5}}
    for objective, options in by_objective.items():
        first = rlk.policy_loss(logp, old, advantages, mask, objective=objective)[0]
        for name, value in options.items():
            second = rlk.policy_loss(logp, old, advantages, mask, objective=objective,
                                     **{name: value})[0]
            assert second != first, name
    empty = mask.clone()
    empty[1] = False
    for agg in ("seq-mean-token-mean", "seq-mean-token-sum"):
        counted = rlk.policy_loss(logp, old, advantages, empty, agg=agg, count_empty_rows=True)
        assert counted[0] != rlk.policy_loss(logp, old, advantages, empty, agg=agg)[0]


def test_defaults_have_one_source():
    """The public signature carries no option default: PolicyLossOptions is the source."""
    parameters = inspect.signature(rlk.policy_loss).parameters
    assert not set(PolicyLossOptions.names()) & set(parameters)
    assert inspect.signature(reference.policy_loss).parameters["options"].default is None
    logp, old, advantages, mask = _batch()
    plain = rlk.policy_loss(logp, old, advantages, mask)[0]
    every_default = dataclasses.asdict(PolicyLossOptions())
    assert rlk.policy_loss(logp, old, advantages, mask, **every_default)[0] == plain
    assert rlk.policy_loss(logp, old, advantages, mask, options=PolicyLossOptions())[0] == plain


def test_options_object_and_keywords_merge_keywords_winning():
    logp, old, advantages, mask = _batch(spread=1.0)
    options = PolicyLossOptions(clip_high=0.28, agg="seq-mean-token-mean")
    merged = rlk.policy_loss(logp, old, advantages, mask, options=options, clip_high=0.5)[0]
    want = rlk.policy_loss(logp, old, advantages, mask, clip_high=0.5,
                           agg="seq-mean-token-mean")[0]
    assert merged == want
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.clip_high = 0.3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("settings", "error", "message"),
    [
        ({"kl_coef": True}, TypeError, "kl_coef must be a float, got bool True"),
        ({"clip_high": "0.2"}, TypeError, "clip_high must be a float, got str"),
        ({"dual_clip": torch.tensor(2.0)}, TypeError, "dual_clip must be a float or None"),
        ({"kl_bias_correction": 1}, TypeError, "kl_bias_correction must be True or False"),
        ({"clip_low": 1.5}, ValueError, "clip_low must be finite and >= 0 and <= 1; got 1.5"),
        ({"clip_high": math.inf}, ValueError, "clip_high must be finite and >= 0"),
        ({"kl_coef": math.nan}, ValueError, "kl_coef must be finite"),
        ({"dual_clip": 1.0}, ValueError, "dual_clip must be None or finite and > 1"),
        ({"scale": 0.0}, ValueError, "scale must be finite and > 0"),
        ({"divisor": -3.0}, ValueError, "divisor must be None or finite and > 0"),
        ({"log_ratio_max": -1.0}, ValueError, "log_ratio_max must be None or finite and > 0"),
        ({"kl_estimator": "k4"}, ValueError, "kl_estimator must be one of 'k1', 'k2', 'k3'"),
        ({"ratio_level": "seq"}, ValueError, "ratio_level must be one of"),
        ({"agg": "mean"}, ValueError, "agg must be one of 'token-mean'"),
        ({"objective": "grpo"}, ValueError, "objective must be one of 'ppo'"),
        ({"clip_ratio": 0.2}, TypeError, "unexpected option 'clip_ratio' .did you mean "
                                         "'clip_low'.*options are objective, clip_low"),
        ({"options": {"clip_low": 0.1}}, TypeError, "options must be PolicyLossOptions or None"),
        ({"objective": "sapo", "dual_clip": 2.0}, ValueError,
         "dual_clip applies to objective 'ppo' only"),
        ({"objective": "cispo", "ratio_cap": 2.0}, ValueError, "ratio_cap applies to objective"),
        ({"objective": "vespo", "ratio_level": "sequence"}, ValueError,
         "'vespo' .* takes ratio_level 'token'"),
        ({"objective": "vespo", "log_ratio_max": 20.0}, ValueError, "clamps its log ratios"),
        ({"count_empty_rows": True}, ValueError, "count_empty_rows counts sequences"),
        ({"kl_coef": 0.1}, ValueError, "kl_coef=0.1 needs ref_logp"),
        ({"kl_clamp": 10.0}, ValueError, "kl_clamp=10.0 needs ref_logp"),
        ({"kl_bias_correction": True}, ValueError, "kl_bias_correction=True needs ref_logp"),
        ({"tis_cap": 2.0}, ValueError, "tis_cap needs rollout_logp"),
    ],
)
def test_bad_options(settings, error, message):
    logp, old, advantages, mask = _batch()
    with pytest.raises(error, match=message):
        rlk.policy_loss(logp, old, advantages, mask, **settings)


def test_numpy_scalars_and_ints_are_numbers():
    logp, old, advantages, mask = _batch(spread=1.0)
    want = rlk.policy_loss(logp, old, advantages, mask, clip_high=0.25, dual_clip=3.0)[0]
    got = rlk.policy_loss(logp, old, advantages, mask, clip_high=np.float32(0.25),
                          dual_clip=np.int64(3))[0]
    assert got == want
    assert PolicyLossOptions(dual_clip=3).dual_clip == 3.0


def test_a_cached_valid_value_does_not_admit_its_equal_bool():
    """Validated options are cached by value; True == 1 must still be refused."""
    logp, old, advantages, mask = _batch()
    rlk.policy_loss(logp, old, advantages, mask, ref_logp=logp, kl_coef=1)
    with pytest.raises(TypeError, match="kl_coef must be a float, got bool"):
        rlk.policy_loss(logp, old, advantages, mask, ref_logp=logp, kl_coef=True)


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"logp": torch.zeros(B, T, dtype=torch.int64)}, TypeError, "logp must have dtype"),
        ({"logp": torch.zeros(B * T)}, ValueError, r"logp must be \[B, T\]"),
        ({"old_logp": torch.zeros(B, T + 1)}, ValueError, r"old_logp must have shape \(5, 8\)"),
        ({"advantages": torch.zeros(T)}, ValueError,
         r"advantages must have shape \(5,\) or \(5, 1\) .* or \(5, 8\)"),
        ({"advantages": torch.zeros(B, dtype=torch.int64)}, TypeError,
         "advantages must have dtype"),
        ({"mask": torch.ones(B, T, dtype=torch.complex64)}, TypeError, "mask must have dtype"),
        ({"mask": torch.ones(B, T + 1)}, ValueError, r"mask must have shape \(5, 8\)"),
        ({"ref_logp": torch.zeros(B, T, dtype=torch.int32)}, TypeError, "ref_logp must have"),
        ({"importance_weights": torch.ones(B, 2)}, ValueError, "importance_weights must have"),
        ({"old_logp": torch.zeros(B, T, device="meta")}, ValueError,
         "old_logp is on meta but logp is on cpu"),
    ],
)
def test_bad_tensors(change, error, message):
    logp, old, advantages, mask = _batch()
    kwargs = {"logp": logp, "old_logp": old, "advantages": advantages, "mask": mask}
    kwargs.update(change)
    with pytest.raises(error, match=message):
        rlk.policy_loss(kwargs.pop("logp"), kwargs.pop("old_logp"), kwargs.pop("advantages"),
                        kwargs.pop("mask"), **kwargs)


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int32, torch.int64,
                                   torch.float16, torch.float64])
def test_masks_of_any_dtype_mean_nonzero(dtype):
    logp, old, advantages, mask = _batch()
    values = mask.to(dtype) * (3 if dtype not in (torch.bool, torch.uint8) else 1)
    settings = {"ratio_level": "sequence", "agg": "seq-mean-token-mean"}
    want = rlk.policy_loss(logp, old, advantages, mask, **settings)
    got = rlk.policy_loss(logp, old, advantages, values, **settings)
    assert got[0] == want[0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_logp_of_any_float_dtype_gets_its_gradient_in_that_dtype(dtype):
    logp, old, advantages, mask = _batch()
    rounded = logp.to(dtype)
    leaf = rounded.clone().requires_grad_(True)
    loss, _ = rlk.policy_loss(leaf, old.to(torch.bfloat16), advantages.double(), mask,
                              kl_coef=0.1, ref_logp=old.half())
    loss.backward()
    assert loss.dtype == torch.float32 and leaf.grad.dtype == dtype
    want_loss, _, want_grad = _reference_with_grad(
        rounded, old.to(torch.bfloat16), advantages.double(), mask, ref_logp=old.half(),
        options=PolicyLossOptions(kl_coef=0.1))
    _close(loss, want_loss)
    rtol = {torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float64: 1e-5}[dtype]
    _close(leaf.grad, want_grad, atol=1e-6, rtol=rtol)


def test_advantage_and_weight_shapes_are_equivalent():
    logp, old, advantages, mask = _batch()
    weights = torch.rand(B, generator=GEN) + 0.5
    per_sequence = rlk.policy_loss(logp, old, advantages, mask, importance_weights=weights)[0]
    column = rlk.policy_loss(logp, old, advantages[:, None], mask,
                             importance_weights=weights[:, None])[0]
    per_token = rlk.policy_loss(logp, old, advantages[:, None].expand(B, T), mask,
                                importance_weights=weights[:, None].expand(B, T))[0]
    _close(column, per_sequence, atol=0, rtol=0)
    _close(per_token, per_sequence, atol=0, rtol=0)


def test_normalisers_give_the_frameworks_divisors():
    """token-mean, the constant divisor (Dr. GRPO), empty rows counted (TRL grpo), scale."""
    logp, old, advantages, mask = _batch()
    mask[3] = False
    ratio = torch.exp(logp - old)
    adv = advantages[:, None]
    terms = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)) * mask
    lengths = mask.sum(1)

    def loss(**settings):
        return rlk.policy_loss(logp, old, advantages, mask, **settings)[0]

    _close(loss(), terms.sum() / mask.sum())
    _close(loss(agg="token-sum", divisor=4 * 16.0), terms.sum() / (4 * 16))
    _close(loss(agg="token-mean", divisor=1000.0, scale=0.5), terms.sum() / 1000 * 0.5)
    per_row = terms.sum(1) / lengths.clamp(min=1)
    _close(loss(agg="seq-mean-token-mean"), per_row.sum() / 4)
    _close(loss(agg="seq-mean-token-mean", count_empty_rows=True), per_row.sum() / B)
    _close(loss(agg="seq-mean-token-sum-norm"), terms.sum() / (4 * T))
    _close(loss(agg="seq-mean-token-sum-norm", count_empty_rows=True), terms.sum() / (B * T))


def test_clip_fractions_split_low_and_high_and_count_sequences_for_sequence_ratios():
    logp, old, advantages, mask = _batch()
    mask[:] = True
    old[0], advantages[0] = logp[0] - 1.0, 1.0  # ratio e > 1.2, A > 0: clipped high
    old[1], advantages[1] = logp[1] + 1.0, -1.0  # ratio 1/e < 0.8, A < 0: clipped low
    old[2:] = logp[2:]  # ratio 1: not clipped
    _, metrics = rlk.policy_loss(logp, old, advantages, mask)
    assert metrics["clip_high_fraction"] == pytest.approx(1 / B)
    assert metrics["clip_low_fraction"] == pytest.approx(1 / B)
    assert metrics["clip_fraction"] == pytest.approx(2 / B)
    short = mask.clone()
    short[0, 1:] = False  # one token: a sequence counts once whatever its length
    _, by_sequence = rlk.policy_loss(logp, old, advantages, short, ratio_level="sequence")
    assert by_sequence["clip_high_fraction"] == pytest.approx(1 / B)
    _, by_token = rlk.policy_loss(logp, old, advantages, short)
    assert by_token["clip_high_fraction"] == pytest.approx(1 / short.sum().item())


def test_dual_clip_fraction_counts_tokens_the_dual_bound_holds():
    logp, old, advantages, mask = _batch()
    mask[:] = True
    old[0], advantages[0] = logp[0] - 2.0, -1.0  # ratio e^2 > 3 with A < 0
    _, metrics = rlk.policy_loss(logp, old, advantages, mask, dual_clip=3.0)
    assert metrics["dual_clip_fraction"] == pytest.approx(1 / B)


def test_gspo_overflow_leaves_masked_gradient_exactly_zero():
    """#19: an overflowing sequence ratio gave NaN gradients at masked positions."""
    logp, old, advantages, mask = _batch()
    mask[0, -3:] = False
    old[0] = logp[0] - 200.0  # exp(200) overflows float32
    advantages[0] = -1.0
    for level in ("sequence", "sequence-token"):
        leaf = logp.clone().requires_grad_(True)
        loss, _ = rlk.policy_loss(leaf, old, advantages, mask, ratio_level=level)
        loss.backward()
        assert torch.equal(leaf.grad[~mask], torch.zeros(int((~mask).sum()))), level
        assert not torch.isfinite(loss)


@pytest.mark.parametrize("level", ["token", "sequence", "sequence-token"])
def test_nan_logp_at_a_real_token_gives_nan_loss_and_nan_gradient(level):
    """#19: a NaN logp at an active position gave a NaN loss but a 0 gradient."""
    logp, old, advantages, mask = _batch()
    logp[1, 0] = float("nan")
    leaf = logp.clone().requires_grad_(True)
    loss, metrics = rlk.policy_loss(leaf, old, advantages, mask, ratio_level=level)
    loss.backward()
    assert torch.isnan(loss) and torch.isnan(metrics["mean_ratio"])
    assert torch.isnan(leaf.grad[1, 0])
    assert torch.isfinite(leaf.grad[[0, 2, 3, 4]]).all()
    assert torch.equal(leaf.grad[~mask], torch.zeros(int((~mask).sum())))


def test_masked_garbage_never_reaches_the_result():
    logp, old, advantages, mask, ref, rollout = _companions()
    kwargs = {"kl_coef": 0.1, "tis_cap": 1.5, "ratio_level": "sequence"}
    clean = rlk.policy_loss(logp, old, advantages, mask, ref_logp=ref, rollout_logp=rollout,
                            **kwargs)
    dirty = [t.clone() for t in (logp, old, ref, rollout)]
    for tensor, value in zip(dirty, (math.nan, math.inf, -math.inf, math.nan), strict=True):
        tensor[~mask] = value
    leaf = dirty[0].requires_grad_(True)
    messy = rlk.policy_loss(leaf, dirty[1], advantages, mask, ref_logp=dirty[2],
                            rollout_logp=dirty[3], **kwargs)
    assert messy[0] == clean[0]
    messy[0].backward()
    assert torch.isfinite(leaf.grad).all()


def test_gspo_gradient_equals_the_stop_gradient_token_form_of_the_paper():
    """GSPO-token: s_it = sg[s_i] * pi_t / sg[pi_t]; equal to GSPO under seq-mean-token-mean
    with one advantage per sequence, and what ratio_level="sequence-token" computes always."""
    logp, old, advantages, mask = _batch(spread=0.02)
    options = {"clip_low": 0.01, "clip_high": 0.01, "agg": "seq-mean-token-mean"}
    grads = {}
    for level in ("sequence", "sequence-token"):
        leaf = logp.clone().requires_grad_(True)
        rlk.policy_loss(leaf, old, advantages, mask, ratio_level=level, **options)[0].backward()
        grads[level] = leaf.grad
    x = logp.double().requires_grad_(True)
    m = mask.double()
    seq = torch.exp(((x - old) * m).sum(1) / m.sum(1)).detach()
    s = seq.unsqueeze(1) * torch.exp(x - x.detach())
    a = advantages.double().unsqueeze(1)
    term = torch.maximum(-a * s, -a * s.clamp(0.99, 1.01))
    ((term * m).sum(1) / m.sum(1)).mean().backward()
    _close(grads["sequence"], x.grad, atol=1e-6)
    _close(grads["sequence-token"], x.grad, atol=1e-6)


def test_gradient_flows_to_logp_only():
    logp, old, advantages, mask = _batch()
    leaves = [t.clone().requires_grad_(True) for t in (logp, old, advantages)]
    ref = (logp + 0.1).requires_grad_(True)
    rlk.policy_loss(*leaves, mask, ref_logp=ref, kl_coef=0.1)[0].backward()
    assert leaves[0].grad is not None
    assert leaves[1].grad is None and leaves[2].grad is None and ref.grad is None


def test_nothing_masked_in_is_zero_and_finite():
    logp, old, advantages, _ = _batch()
    for settings in ({}, {"agg": "seq-mean-token-mean"}, {"agg": "seq-mean-token-sum-norm"},
                     {"objective": "vespo"}, {"ratio_level": "sequence"}):
        leaf = logp.clone().requires_grad_(True)
        loss, metrics = rlk.policy_loss(leaf, old, advantages, torch.zeros(B, T), **settings)
        loss.backward()
        assert loss == 0 and all(value == 0 for value in metrics.values())
        assert torch.equal(leaf.grad, torch.zeros(B, T))


# ---------------------------------------------------------------------------
# the eager path and the torch operator


def test_eager_calls_skip_torch_library_and_match_the_torch_operator():
    logp, old, advantages, mask, ref, rollout = _companions()
    options = PolicyLossOptions(kl_coef=0.1, tis_cap=1.4, ratio_level="sequence")
    leaf = logp.clone().requires_grad_(True)
    loss, metrics = rlk.policy_loss(leaf, old, advantages, mask, ref_logp=ref,
                                    rollout_logp=rollout, options=options)
    assert type(loss.grad_fn).__name__ == "_KernelFunctionBackward"
    loss.backward()
    op_leaf = logp.clone().requires_grad_(True)
    op_loss, op_metrics = torch.ops.rlk.policy_loss(op_leaf, old, advantages, mask, ref, rollout,
                                                    None, *options.flat())
    assert "rlk_policy_loss" in type(op_loss.grad_fn).__name__
    op_loss.backward()
    assert torch.equal(loss, op_loss) and torch.equal(leaf.grad, op_leaf.grad)
    assert torch.equal(torch.stack(list(metrics.values())), op_metrics)


@pytest.mark.parametrize("case", ["bf16-per-token", "weights-b1", "kl-tis", "vespo-float64"])
def test_eager_path_matches_the_torch_operator_in_every_argument_form(case):
    """The eager path's own checks and reshapes ([B, 1] -> [B]) give what the torch operator
    gives, loss, metrics and gradient, bit for bit."""
    logp, old, advantages, mask, ref, rollout = _companions()
    kwargs: dict = {}
    if case == "bf16-per-token":
        logp, advantages = logp.bfloat16(), advantages.unsqueeze(1).expand(B, T).contiguous()
        kwargs = {"clip_high": 0.28}
    elif case == "weights-b1":
        kwargs = {"importance_weights": torch.rand(B, 1, generator=GEN) + 0.5,
                  "agg": "seq-mean-token-sum"}
    elif case == "kl-tis":
        kwargs = {"ref_logp": ref, "rollout_logp": rollout, "kl_coef": 0.1, "tis_cap": 2.0}
    else:
        logp, mask, kwargs = logp.double(), mask.to(torch.int32), {"objective": "vespo"}
    leaf = logp.clone().requires_grad_(True)
    loss, metrics = rlk.policy_loss(leaf, old, advantages, mask, **kwargs)
    assert type(loss.grad_fn).__name__ == "_KernelFunctionBackward"
    loss.backward()
    tensors = {name: kwargs.pop(name, None)
               for name in ("ref_logp", "rollout_logp", "importance_weights")}
    if tensors["importance_weights"] is not None:
        tensors["importance_weights"] = tensors["importance_weights"].reshape(B)
    options = PolicyLossOptions(**kwargs)
    op_leaf = logp.clone().requires_grad_(True)
    op_loss, op_metrics = torch.ops.rlk.policy_loss(op_leaf, old, advantages, mask,
                                                    *tensors.values(), *options.flat())
    op_loss.backward()
    assert torch.equal(loss, op_loss) and torch.equal(leaf.grad, op_leaf.grad)
    assert torch.equal(torch.stack(list(metrics.values())), op_metrics)
    assert not any(value.requires_grad for value in metrics.values())


def test_eager_backward_runs_under_the_forward_policy():
    """The backward selects nothing itself, but kernels it calls dispatch under the policy of
    the forward, also when .backward() runs outside the use_backends scope."""
    logp, old, advantages, mask = _batch()
    leaf = logp.clone().requires_grad_(True)
    seen = []
    original = POLICY_LOSS.operator.backward

    def spy(bound, args, grads, needs):
        seen.append(captured_policy())
        return original(bound, args, grads, needs)

    with rlk.use_backends("native") as policy:
        loss, _ = rlk.policy_loss(leaf, old, advantages, mask)
    object.__setattr__(POLICY_LOSS.operator, "backward", spy)
    try:
        loss.backward()
    finally:
        object.__setattr__(POLICY_LOSS.operator, "backward", original)
    assert seen == [policy] and captured_policy() is None and leaf.grad is not None


def test_torch_compile_graph_holds_the_torch_operator():
    """torch.compile never sees the eager path: its graph holds rlk::policy_loss, and the
    gradient through the compiled step is the eager one."""
    logp, old, advantages, mask = _batch()
    graphs = []

    def backend(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    def step(x):
        return rlk.policy_loss(x, old, advantages, mask, clip_high=0.28)[0]

    compiled_x, eager_x = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
    torch.compile(step, backend=backend, fullgraph=True)(compiled_x).backward()
    step(eager_x).backward()
    targets = {str(node.target) for graph in graphs for node in graph.graph.nodes}
    assert "rlk.policy_loss.default" in targets
    assert torch.equal(compiled_x.grad, eager_x.grad)


def test_eager_path_without_grad_returns_plain_tensors():
    logp, old, advantages, mask = _batch()
    loss, _ = rlk.policy_loss(logp, old, advantages, mask)
    assert loss.grad_fn is None
    with torch.no_grad():
        assert rlk.policy_loss(logp.requires_grad_(True), old, advantages, mask)[0].grad_fn is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_a_forward_with_grad_serves_the_eager_backward(use_plugins, dtype):
    """A kernel whose forward carries `with_grad` is called once per eager step: the backward
    scales its float32 gradient, rounded once to logp's dtype, and calls no kernel; that is the
    kernel backward's own gradient at any upstream, also from a retained graph, and a double
    backward is refused, here already at the create_graph backward (issue #31 S4)."""
    use_plugins(withgrad="fake_plugins:withgrad")
    logp, old, advantages, mask = _batch()
    leaf = logp.to(dtype).requires_grad_(True)
    before = dict(fake_plugins.calls)
    loss, metrics = rlk.policy_loss(leaf, old, advantages, mask, clip_high=0.28)
    upstream = torch.tensor(0.75)
    (first,) = torch.autograd.grad(loss, leaf, upstream, retain_graph=True)
    (second,) = torch.autograd.grad(loss, leaf, upstream, retain_graph=True)
    assert fake_plugins.calls["with_grad"] == before["with_grad"] + 1
    assert fake_plugins.calls["loss_backward"] == before["loss_backward"]
    args = (leaf.detach(), old, advantages, mask, None, None, None,
            PolicyLossOptions(clip_high=0.28))
    want_loss, want_metrics = native_policy_loss.forward(*args)
    want = native_policy_loss.backward(upstream, *args)
    assert torch.equal(loss, want_loss)
    assert torch.equal(torch.stack(list(metrics.values())), want_metrics)
    assert first.dtype == dtype and torch.equal(first, want) and torch.equal(second, want)
    # gradients computed in the forward cannot be tied to the inputs: refused at once
    with pytest.raises(RuntimeError, match=r"rlk\.policy_loss has no double backward"):
        torch.autograd.grad(loss, leaf, torch.ones((), requires_grad=True), create_graph=True)


def test_the_conformance_kit_checks_forward_with_grad(use_plugins):
    """The kit's backward check (OpSpec.grad_check) compares the gradient the eager path would
    take from forward.with_grad with the float64 reference too, not only the backward's."""
    use_plugins(withgrad="fake_plugins:withgrad")
    assert POLICY_LOSS.grad_check is not None and POLICY_LOSS.grad_tolerances is not None
    logp, old, advantages, mask = _batch()
    for dtype in (torch.float32, torch.bfloat16):
        args = POLICY_LOSS.prepare(logp.to(dtype), old, advantages, mask,
                                   agg="seq-mean-token-mean")
        checks = list(POLICY_LOSS.grad_check(POLICY_LOSS.kernel(args), args,
                                             torch.Generator().manual_seed(0)))
        assert [name for name, *_ in checks] == ["grad_logp", "grad_logp from forward.with_grad"]
        for name, got, want in checks:
            assert got.dtype == dtype
            assert_matches(name, got, want, POLICY_LOSS.grad_tolerances[dtype])


def test_a_forward_with_grad_breaking_the_contract_is_refused(use_plugins):
    use_plugins(badwithgrad="fake_plugins:badwithgrad")
    logp, old, advantages, mask = _batch()
    with pytest.raises(rlk.KernelError, match=r"backend 'badwithgrad'.*forward\.with_grad.*"
                                              r"bfloat16 \[5, 8\].*float32 \[5, 8\]"):
        rlk.policy_loss(logp.bfloat16().requires_grad_(True), old, advantages, mask)
    assert rlk.policy_loss(logp.bfloat16(), old, advantages, mask)[0].dtype == torch.float32


def test_in_place_change_between_forward_and_backward_raises():
    logp, old, advantages, mask = _batch()
    leaf = logp.clone().requires_grad_(True)
    x = leaf * 1.0
    loss, _ = rlk.policy_loss(x, old, advantages, mask)
    with torch.no_grad():
        x.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_tracing_takes_the_torch_operator():
    from torch.fx.experimental.proxy_tensor import make_fx

    logp, old, advantages, mask = _batch()

    def step(x):
        return rlk.policy_loss(x, old, advantages, mask, clip_high=0.28)[0]

    graph = make_fx(step)(logp)
    targets = {str(node.target) for node in graph.graph.nodes}
    assert "rlk.policy_loss.default" in targets


@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_fullgraph_with_options_as_arguments(dynamic):
    """#19: dynamic=True failed on math.isfinite of a symbolic option value."""
    logp, old, advantages, mask, ref, _ = _companions()

    def step(x, kl_coef, clip_high):
        loss, metrics = rlk.policy_loss(x, old, advantages, mask, ref_logp=ref, kl_coef=kl_coef,
                                        clip_high=clip_high, ratio_level="sequence",
                                        agg="seq-mean-token-mean")
        return loss, metrics["clip_fraction"]

    compiled = torch.compile(step, fullgraph=True, dynamic=dynamic)
    for kl_coef, clip_high in ((0.02, 0.28), (0.05, 0.2)):
        eager_x, compiled_x = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
        eager_loss, eager_clip = step(eager_x, kl_coef, clip_high)
        eager_loss.backward()
        compiled_loss, compiled_clip = compiled(compiled_x, kl_coef, clip_high)
        compiled_loss.backward()
        _close(compiled_loss, eager_loss, atol=0, rtol=0)
        _close(compiled_clip, eager_clip, atol=0, rtol=0)
        _close(compiled_x.grad, eager_x.grad, atol=0, rtol=0)


def test_torch_compile_refuses_bad_options_too():
    logp, old, advantages, mask = _batch()

    def step(x, clip_low):
        return rlk.policy_loss(x, old, advantages, mask, clip_low=clip_low)[0]

    with pytest.raises(Exception, match="clip_low must be finite"):
        torch.compile(step, fullgraph=True, dynamic=True)(logp, 1.5)


def test_opcheck():
    logp, old, advantages, mask, ref, rollout = _companions()
    for options in (PolicyLossOptions(kl_coef=0.1, kl_estimator="k3+", dual_clip=3.0),
                    PolicyLossOptions(objective="vespo", agg="token-sum", divisor=10.0)):
        torch.library.opcheck(torch.ops.rlk.policy_loss.default,
                              (logp.clone().requires_grad_(True), old, advantages, mask.float(),
                               ref, rollout, None, *options.flat()))


def test_double_backward_is_refused_clearly():
    logp, old, advantages, mask = _batch()
    leaf = logp.clone().requires_grad_(True)
    loss, _ = rlk.policy_loss(leaf, old, advantages, mask)
    upstream = torch.ones((), requires_grad=True)
    (grad,) = torch.autograd.grad(loss, leaf, grad_outputs=upstream, create_graph=True)
    with pytest.raises(RuntimeError, match=r"rlk\.policy_loss has no double backward"):
        grad.sum().backward()
