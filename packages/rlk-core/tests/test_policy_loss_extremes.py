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
