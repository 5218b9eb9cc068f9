"""The public policy_loss: each method's settings, gradients, metrics, errors, torch.compile."""

from __future__ import annotations

import pytest
import torch

import rlk
from rlk import reference

GEN = torch.Generator().manual_seed(3)
B, T = 5, 8


def _batch(spread: float = 0.3):
    logp = -torch.rand(B, T, generator=GEN) * 3
    old = logp + torch.randn(B, T, generator=GEN) * spread
    mask = torch.rand(B, T, generator=GEN) > 0.3
    mask[:, 0] = True
    advantages = torch.randn(B, generator=GEN)
    return logp, old, advantages, mask


def _close(actual, expected, atol=1e-5, rtol=1e-5):
    torch.testing.assert_close(actual.double(), expected.double(), atol=atol, rtol=rtol)


METHODS = {
    "ppo": {},
    "ppo-dual-clip": {"dual_clip": 3.0},
    "grpo": {"kl_coef": 0.04, "kl_estimator": "k3", "agg": "seq-mean-token-mean"},
    "dapo": {"clip_low": 0.2, "clip_high": 0.28, "agg": "token-mean"},
    "dr-grpo": {"agg": "seq-mean-token-sum-norm"},
    "gspo": {"ratio_level": "sequence", "clip_low": 3e-4, "clip_high": 4e-4,
             "agg": "seq-mean-token-mean"},
    "tis": {"tis_cap": 1.5},
    "k1-seq-sum": {"kl_coef": 0.1, "kl_estimator": "k1", "agg": "seq-mean-token-sum"},
    "k2": {"kl_coef": 0.1, "kl_estimator": "k2"},
}


@pytest.mark.parametrize("method", sorted(METHODS))
def test_loss_metrics_and_gradient_match_reference(method):
    options = METHODS[method]
    logp, old, advantages, mask = _batch()
    extra = {}
    if "kl_coef" in options:
        extra["ref_logp"] = logp + torch.randn(B, T, generator=GEN) * 0.2
    if "tis_cap" in options:
        extra["rollout_logp"] = old + torch.randn(B, T, generator=GEN) * 0.5
    leaf = logp.clone().requires_grad_(True)
    loss, metrics = rlk.policy_loss(leaf, old, advantages, mask, **extra, **options)
    assert loss.shape == () and loss.dtype == torch.float32
    assert sorted(metrics) == ["clip_fraction", "mean_kl", "mean_ratio", "truncated_fraction"]
    assert all(not value.requires_grad for value in metrics.values())
    loss.backward()
    want_leaf = logp.double().requires_grad_(True)
    want_loss, want_metrics = reference.policy_loss(want_leaf, old, advantages, mask, **extra,
                                                    **options)
    want_loss.backward()
    _close(loss, want_loss)
    _close(leaf.grad, want_leaf.grad, atol=1e-6)
    names = ("clip_fraction", "mean_ratio", "mean_kl", "truncated_fraction")
    for index, name in enumerate(names):
        _close(metrics[name], want_metrics[index])
    assert torch.equal(leaf.grad[~mask], torch.zeros(int((~mask).sum())))


def test_options_change_the_loss_where_they_should():
    """Guards against an option being silently ignored."""
    logp, old, advantages, mask = _batch(spread=1.0)
    advantages[0] = -2.0
    old[0] = logp[0] - 2.0
    base, metrics = rlk.policy_loss(logp, old, advantages, mask)
    assert 0 < metrics["clip_fraction"] < 1
    dual, _ = rlk.policy_loss(logp, old, advantages, mask, dual_clip=2.0)
    assert dual < base
    higher, _ = rlk.policy_loss(logp, old, advantages, mask, clip_high=0.5)
    assert higher != base
    for agg in ("seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        assert rlk.policy_loss(logp, old, advantages, mask, agg=agg)[0] != base
    rollout = old + 0.7
    capped, capped_metrics = rlk.policy_loss(logp, old, advantages, mask, rollout_logp=rollout,
                                             tis_cap=0.9)
    assert capped_metrics["truncated_fraction"] == 0  # exp(-0.7) < 0.9 everywhere
    capped_low, low_metrics = rlk.policy_loss(logp, old, advantages, mask,
                                              rollout_logp=rollout, tis_cap=0.2)
    assert low_metrics["truncated_fraction"] == 1 and capped_low != capped


def test_dr_grpo_divides_by_a_constant_and_token_mean_by_the_token_count():
    logp, old, advantages, mask = _batch()
    per_token = -advantages.unsqueeze(1) * torch.exp(logp - old).clamp(0.8, 1.2)
    unclipped = -advantages.unsqueeze(1) * torch.exp(logp - old)
    terms = torch.maximum(per_token, unclipped) * mask
    _close(rlk.policy_loss(logp, old, advantages, mask, agg="seq-mean-token-sum-norm")[0],
           terms.sum() / (B * T))
    _close(rlk.policy_loss(logp, old, advantages, mask)[0], terms.sum() / mask.sum())


def test_gspo_gradient_equals_the_stop_gradient_token_form_of_the_paper():
    """GSPO-token: s_it = sg[s_i] * pi_t / sg[pi_t]; equal to GSPO under seq-mean-token-mean."""
    logp, old, advantages, mask = _batch(spread=0.02)
    options = {"ratio_level": "sequence", "clip_low": 0.01, "clip_high": 0.01,
               "agg": "seq-mean-token-mean"}
    leaf = logp.clone().requires_grad_(True)
    rlk.policy_loss(leaf, old, advantages, mask, **options)[0].backward()
    x = logp.double().requires_grad_(True)
    m = mask.double()
    seq = torch.exp(((x - old) * m).sum(1) / m.sum(1)).detach()
    s = seq.unsqueeze(1) * torch.exp(x - x.detach())
    a = advantages.double().unsqueeze(1)
    term = torch.maximum(-a * s, -a * s.clamp(0.99, 1.01))
    ((term * m).sum(1) / m.sum(1)).mean().backward()
    _close(leaf.grad, x.grad, atol=1e-6)


def test_per_token_advantages_equal_broadcast_per_sequence_ones():
    logp, old, advantages, mask = _batch()
    loss_b, _ = rlk.policy_loss(logp, old, advantages, mask)
    loss_bt, _ = rlk.policy_loss(logp, old, advantages.unsqueeze(1).expand(B, T), mask)
    _close(loss_b, loss_bt, atol=0, rtol=0)


def test_gradient_flows_to_logp_only():
    logp, old, advantages, mask = _batch()
    leaves = [t.clone().requires_grad_(True) for t in (logp, old, advantages)]
    ref = (logp + 0.1).requires_grad_(True)
    rlk.policy_loss(*leaves, mask, ref_logp=ref, kl_coef=0.1)[0].backward()
    assert leaves[0].grad is not None
    assert leaves[1].grad is None and leaves[2].grad is None and ref.grad is None


def test_nothing_masked_in_is_zero_and_finite():
    logp, old, advantages, _ = _batch()
    leaf = logp.clone().requires_grad_(True)
    loss, metrics = rlk.policy_loss(leaf, old, advantages, torch.zeros(B, T),
                                    agg="seq-mean-token-mean")
    loss.backward()
    assert loss == 0 and all(value == 0 for value in metrics.values())
    assert torch.equal(leaf.grad, torch.zeros(B, T))


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"logp": torch.zeros(B, T, dtype=torch.float16)}, TypeError, "logp must have dtype"),
        ({"logp": torch.zeros(B * T)}, ValueError, r"logp must be \[B, T\]"),
        ({"old_logp": torch.zeros(B, T + 1)}, ValueError, r"old_logp must have shape \(5, 8\)"),
        ({"advantages": torch.zeros(T)}, ValueError, r"advantages must have shape \(5,\)"),
        ({"mask": torch.ones(B, T, dtype=torch.int64)}, TypeError, "mask must have dtype"),
        ({"clip_low": 1.0}, ValueError, "clip_low must be finite and >= 0.0 and < 1.0"),
        ({"clip_high": -0.1}, ValueError, "clip_high must be finite and >= 0.0"),
        ({"dual_clip": 1.0}, ValueError, "dual_clip must be finite and > 1.0"),
        ({"kl_coef": 0.1}, ValueError, "kl_coef=0.1 needs ref_logp"),
        ({"tis_cap": 2.0}, ValueError, "tis_cap needs rollout_logp"),
        ({"kl_estimator": "k4"}, ValueError, "kl_estimator must be one of 'k1', 'k2', 'k3'"),
        ({"ratio_level": "seq"}, ValueError, "ratio_level must be one of"),
        ({"agg": "mean"}, ValueError, "agg must be one of 'token-mean'"),
        ({"clip_low": "0.2"}, TypeError, "clip_low must be a float, got str"),
    ],
)
def test_bad_arguments(change, error, message):
    logp, old, advantages, mask = _batch()
    kwargs = {"logp": logp, "old_logp": old, "advantages": advantages, "mask": mask}
    kwargs.update(change)
    with pytest.raises(error, match=message):
        rlk.policy_loss(kwargs.pop("logp"), kwargs.pop("old_logp"), kwargs.pop("advantages"),
                        kwargs.pop("mask"), **kwargs)


def test_torch_compile_fullgraph_and_opcheck():
    logp, old, advantages, mask = _batch()
    ref = logp + 0.05

    def step(x):
        loss, metrics = rlk.policy_loss(x, old, advantages, mask, ref_logp=ref, kl_coef=0.02,
                                        ratio_level="sequence", agg="seq-mean-token-mean")
        return loss, metrics["clip_fraction"]

    eager_x, compiled_x = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
    eager_loss, eager_clip = step(eager_x)
    eager_loss.backward()
    compiled_loss, compiled_clip = torch.compile(step, fullgraph=True)(compiled_x)
    compiled_loss.backward()
    _close(compiled_loss, eager_loss, atol=0, rtol=0)
    _close(compiled_clip, eager_clip, atol=0, rtol=0)
    _close(compiled_x.grad, eager_x.grad, atol=0, rtol=0)
    torch.library.opcheck(torch.ops.rlk.policy_loss.default,
                          (logp.clone().requires_grad_(True), old, advantages, mask.float(),
                           ref, None, 0.2, 0.28, 3.0, 0.1, "k2", "token", "token-mean", None))
