"""The float32 gradient of every policy_loss objective and KL estimator at the extremes.

Issue #31 found gradients computed by cancellation: k3 with bias correction as
(1 - e^-d) r + (e^-d - 1 + d) r (exactly 0 at d = -28 where the truth is -2.5e9) and
SAPO's gate * (1 - gate) (100% off at log ratio 3); the GPU fuzz found the first again
under the sequence ratio at one token (-2.27 off by 3.4e-5). The native backward against the
float64 reference's autograd, on rlk.ops.policy_loss.audit's inputs (which say the ranges).
"""

from __future__ import annotations

import pytest
import torch

import rlk
from rlk.ops.policy_loss import native
from rlk.ops.policy_loss.audit import (
    assert_gradient_matches,
    audit_inputs,
    audit_options,
    case_name,
    one_token_inputs,
    reference_gradient,
)
from rlk.ops.policy_loss.options import PolicyLossOptions

AUDIT = audit_options()
SEQUENCE = [o for o in AUDIT if o.ratio_level == "sequence"]


@pytest.mark.parametrize("options", AUDIT, ids=[case_name(o) for o in AUDIT])
def test_native_gradient_matches_float64_at_the_extremes(options):
    inputs = audit_inputs(seed=len(case_name(options)))
    grad = native.backward(torch.tensor(1.0), inputs["logp"], inputs["old_logp"],
                           inputs["advantages"], inputs["mask"], inputs["ref_logp"], None, None,
                           options)
    assert_gradient_matches(grad, reference_gradient(inputs, options), inputs, options)


@pytest.mark.parametrize("options", SEQUENCE, ids=[case_name(o) for o in SEQUENCE])
def test_native_gradient_of_one_token_sequences_does_not_cancel(options):
    inputs = one_token_inputs(seed=len(case_name(options)))
    grad = native.backward(torch.tensor(1.0), inputs["logp"], inputs["old_logp"],
                           inputs["advantages"], inputs["mask"], inputs["ref_logp"], None, None,
                           options)
    assert_gradient_matches(grad, reference_gradient(inputs, options), inputs, options)


@pytest.mark.parametrize("temperature", (0.05, 1.0, 20.0))
def test_native_sapo_gradient_matches_float64_at_extreme_temperatures(temperature):
    options = PolicyLossOptions(objective="sapo", sapo_temperature_pos=temperature,
                                sapo_temperature_neg=temperature, agg="token-sum")
    inputs = audit_inputs(seed=7)
    grad = native.backward(torch.tensor(1.0), inputs["logp"], inputs["old_logp"],
                           inputs["advantages"], inputs["mask"], None, None, None, options)
    inputs["ref_logp"] = None
    assert_gradient_matches(grad, reference_gradient(inputs, options), inputs, options)


def overflowing_kl_inputs(device: str = "cpu") -> dict[str, torch.Tensor]:
    """One sequence whose k3 KL passes float32's range (ref_logp - logp = 95.7 at its second
    token: the H100 fuzz's seed 393507177, through linear_policy_loss), with rollout log-probs."""
    rows = {"logp": [-7.1516, -98.7916, -13.7693, -37.6081],
            "old_logp": [-2.0068, -3.0672, -0.3648, -0.5421],
            "ref_logp": [-1.9891, -3.0789, -0.3521, -0.5367],
            "rollout_logp": [-1.9958, -3.0779, -0.3635, -0.5478]}
    inputs = {name: torch.tensor([row], device=device) for name, row in rows.items()}
    inputs["advantages"] = torch.tensor([-0.7193], device=device)
    inputs["mask"] = torch.ones(1, 4, dtype=torch.bool, device=device)
    return inputs


@pytest.mark.parametrize("device", ["cpu", *(["cuda"] if torch.cuda.is_available() else [])])
@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
def test_a_zero_kl_coefficient_leaves_the_loss_alone_where_the_kl_overflows(ratio_level,
                                                                            device):
    """With kl_coef 0 the KL is a metric only: the loss and gradient are those of the call
    without ref_logp (they were 0 * inf = NaN), and mean_kl is float32's inf (every backend
    serving the device: native's token terms, rlk-cuda's kernel)."""
    inputs = overflowing_kl_inputs(device)
    options = PolicyLossOptions(ratio_level=ratio_level, kl_coef=0.0, kl_estimator="k3",
                                tis_cap=0.5)
    found = []
    for ref_logp in (inputs["ref_logp"], None):
        logp = inputs["logp"].clone().requires_grad_(True)
        loss, metrics = rlk.policy_loss(logp, inputs["old_logp"], inputs["advantages"],
                                        inputs["mask"], ref_logp=ref_logp,
                                        rollout_logp=inputs["rollout_logp"], options=options)
        (grad,) = torch.autograd.grad(loss, logp)
        found.append((loss.detach(), grad, metrics["mean_kl"]))
    (loss, grad, mean_kl), (alone, alone_grad, _) = found
    assert bool(loss.isfinite()) and torch.equal(loss, alone), (loss, alone)
    assert torch.equal(grad, alone_grad)
    assert float(mean_kl) == float("inf")
