"""The cuda policy_loss kernel's float32 gradient at the extremes (issue #31's audit).

The same cases as the native audit (packages/rlk-core/tests/test_policy_loss_extremes.py):
every objective and KL estimator, with and without bias correction, at log ratios of
+-30, and sequences of one token under the sequence ratio, against the float64 reference;
and against the native backward, whose formulas the kernel shares.
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

from rlk_cuda import policy_loss as kernels

pytestmark = pytest.mark.gpu
AUDIT = audit_options()
SEQUENCE = [o for o in AUDIT if o.ratio_level == "sequence"]


def _kernel_gradient(inputs: dict, options: PolicyLossOptions) -> torch.Tensor:
    on = {name: None if value is None else value.cuda() for name, value in inputs.items()}
    return kernels.backward(torch.tensor(1.0, device="cuda"), on["logp"], on["old_logp"],
                            on["advantages"], on["mask"], on["ref_logp"], None, None, options)


def _check(inputs: dict, options: PolicyLossOptions) -> None:
    grad = _kernel_gradient(inputs, options)
    assert_gradient_matches(grad, reference_gradient(inputs, options), inputs, options)
    same = native.backward(torch.tensor(1.0), inputs["logp"], inputs["old_logp"],
                           inputs["advantages"], inputs["mask"], inputs["ref_logp"], None, None,
                           options)
    assert_gradient_matches(grad, same, inputs, options)


@pytest.mark.parametrize("options", AUDIT, ids=[case_name(o) for o in AUDIT])
def test_cuda_gradient_matches_float64_at_the_extremes(options: PolicyLossOptions) -> None:
    _check(audit_inputs(seed=len(case_name(options))), options)


@pytest.mark.parametrize("options", SEQUENCE, ids=[case_name(o) for o in SEQUENCE])
def test_cuda_gradient_of_one_token_sequences_does_not_cancel(options: PolicyLossOptions) -> None:
    _check(one_token_inputs(seed=len(case_name(options))), options)


@pytest.mark.parametrize("temperature", (0.05, 1.0, 20.0))
def test_cuda_sapo_gradient_matches_float64_at_extreme_temperatures(temperature: float) -> None:
    options = PolicyLossOptions(objective="sapo", sapo_temperature_pos=temperature,
                                sapo_temperature_neg=temperature, agg="token-sum")
    inputs = audit_inputs(seed=7)
    inputs["ref_logp"] = None
    _check(inputs, options)
