"""The native policy_loss building blocks other ops reuse (rlk.linear_policy_loss)."""

from __future__ import annotations

import pytest
import torch

from rlk.ops.policy_loss import native
from rlk.ops.policy_loss.options import METRICS, PolicyLossOptions

GEN = torch.Generator().manual_seed(11)
B, T = 6, 10


def _inputs():
    logp = -torch.rand(B, T, generator=GEN) * 3
    old = logp + torch.randn(B, T, generator=GEN) * 0.3
    mask = torch.rand(B, T, generator=GEN) > 0.3
    mask[2] = False
    return {
        "logp": logp, "old_logp": old, "advantages": torch.randn(B, generator=GEN),
        "mask": mask, "ref_logp": logp + torch.randn(B, T, generator=GEN) * 0.2,
        "rollout_logp": old + torch.randn(B, T, generator=GEN) * 0.3,
        "importance_weights": torch.rand(B, T, generator=GEN) + 0.5,
    }


TOKEN_LEVEL = {
    "ppo-everything": {"kl_coef": 0.1, "kl_estimator": "k3+", "kl_bias_correction": True,
                       "tis_cap": 1.3, "dual_clip": 2.0, "ratio_cap": 1.4},
    "cispo": {"objective": "cispo", "agg": "seq-mean-token-mean", "log_ratio_min": -20.0,
              "log_ratio_max": 20.0},
    "sapo": {"objective": "sapo", "agg": "seq-mean-token-sum-norm", "kl_coef": 0.05},
    "divisor": {"agg": "token-sum", "divisor": 17.0, "scale": 0.5, "kl_coef": 0.1,
                "kl_clamp": 0.01, "kl_estimator": "abs"},
}


@pytest.mark.parametrize("name", sorted(TOKEN_LEVEL))
def test_chunks_of_tokens_give_the_whole_loss_gradient_and_metrics(name):
    """What linear_policy_loss does: weights from the mask first, then any chunk of tokens
    gets its loss share and gradient as soon as its logp exist."""
    options = PolicyLossOptions(**TOKEN_LEVEL[name])
    x = _inputs()
    tensors = [x[key] for key in ("logp", "old_logp", "advantages", "mask", "ref_logp",
                                  "rollout_logp", "importance_weights")]
    want_loss, want_metrics = native.forward(*tensors, options)
    want_grad = native.backward(torch.tensor(1.0), *tensors, options)
    weights = native.aggregation_weights(x["mask"], options).flatten()
    flat = {key: value.flatten() for key, value in x.items()}
    flat["advantages"] = x["advantages"][:, None].expand(B, T).flatten()
    loss, grad, stats = torch.zeros(()), torch.zeros(B * T), torch.zeros(len(METRICS))
    for chunk in torch.arange(B * T).split(7):
        part = native.token_loss_and_grad(
            flat["logp"][chunk], flat["old_logp"][chunk], flat["advantages"][chunk],
            flat["mask"][chunk], weights[chunk], options, ref_logp=flat["ref_logp"][chunk],
            rollout_logp=flat["rollout_logp"][chunk],
            importance_weights=flat["importance_weights"][chunk])
        loss += part.loss.sum()
        grad[chunk] = part.grad
        stats += part.stats.sum(dim=0)
    torch.testing.assert_close(loss, want_loss, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grad.view(B, T), want_grad, atol=1e-7, rtol=1e-5)
    torch.testing.assert_close(stats / x["mask"].sum(), want_metrics, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("settings", [{"ratio_level": "sequence"},
                                      {"ratio_level": "sequence-token"},
                                      {"objective": "vespo"}])
def test_options_with_a_sequence_pass_are_refused_per_chunk(settings):
    options = PolicyLossOptions(**settings)
    assert options.needs_sequence_pass
    x = _inputs()
    with pytest.raises(ValueError, match="needs whole sequences first"):
        native.token_loss_and_grad(x["logp"], x["old_logp"], x["advantages"][:, None],
                                   x["mask"], x["mask"].float(), options)
    assert not PolicyLossOptions(objective="cispo", kl_bias_correction=True).needs_sequence_pass


def test_aggregation_weights_come_from_the_mask_alone():
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    expected = {
        "token-mean": mask / 6,
        "token-sum": mask * 1.0,
        "seq-mean-token-mean": mask / torch.tensor([[2.0], [1.0], [4.0]]) / 2,
        "seq-mean-token-sum": mask / 2,
        "seq-mean-token-sum-norm": mask / (2 * 4),
    }
    for agg, want in expected.items():
        got = native.aggregation_weights(mask, PolicyLossOptions(agg=agg))
        torch.testing.assert_close(got, want.float(), msg=agg)
    counted = native.aggregation_weights(
        mask, PolicyLossOptions(agg="seq-mean-token-sum", count_empty_rows=True, scale=3.0))
    torch.testing.assert_close(counted, mask * 3.0 / 3)
    fixed = native.aggregation_weights(mask, PolicyLossOptions(divisor=10.0))
    torch.testing.assert_close(fixed, mask / 10.0)
    assert torch.equal(native.aggregation_weights(torch.zeros(2, 3), PolicyLossOptions()),
                       torch.zeros(2, 3))
