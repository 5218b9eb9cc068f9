"""`token_kl`: each token's KL estimate between the policy and a reference policy.

The per-token term `policy_loss` adds to its loss (before `kl_coef`), for a caller that
aggregates or logs it itself (verl's `kl_penalty`, a KL reward penalty). The estimators
are policy_loss's own (`rlk.ops.policy_loss.native.token_kl_and_grad`): elementwise torch
arithmetic that runs on any device, so this is a function, not a dispatched op.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from rlk._runtime import validate
from rlk.ops.policy_loss.native import token_kl_and_grad
from rlk.ops.policy_loss.options import PolicyLossOptions

FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
SETTINGS = ("kl_estimator", "kl_clamp")


class _TokenKL(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logp: Tensor, ref_logp: Tensor, options: PolicyLossOptions) -> Tensor:
        dtype = torch.float64 if torch.float64 in (logp.dtype, ref_logp.dtype) else torch.float32
        value, grad = token_kl_and_grad(logp.to(dtype), ref_logp.to(dtype), options)
        if ctx.needs_input_grad[0]:
            ctx.save_for_backward(grad)
        ctx.logp_dtype = logp.dtype
        return value

    @staticmethod
    def backward(ctx: Any, grad_value: Tensor) -> tuple[Tensor | None, None, None]:
        (grad,) = ctx.saved_tensors
        return (grad_value * grad).to(ctx.logp_dtype), None, None


def token_kl(logp: Tensor, ref_logp: Tensor, *, options: PolicyLossOptions | None = None,
             **settings: Any) -> Tensor:
    """KL(policy || reference) estimated at each token from logp - ref_logp.

    logp and ref_logp: one shape, any float dtype. Settings are `PolicyLossOptions`'
    `kl_estimator` ("k1", "k2", "k3", "abs", or "k1+", "k3+", "abs+": that value with
    k2's gradient) and `kl_clamp` (the value clamped to [-c, c], no gradient where it
    binds), as `options=` (any policy_loss options without kl_bias_correction) and/or
    keywords. Returns float32 (float64 if an input is float64), differentiable w.r.t.
    logp; ref_logp receives no gradient. See docs/ops/token_kl.md.
    """
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise TypeError(f"token_kl takes the settings {', '.join(SETTINGS)} (or options=); "
                        f"got {', '.join(unknown)}")
    chosen = PolicyLossOptions.build(options, settings)
    validate.tensor("logp", logp, FLOATS)
    validate.tensor("ref_logp", ref_logp, FLOATS)
    validate.shape("ref_logp", ref_logp, tuple(logp.shape), " (the shape of logp)")
    validate.same_device("ref_logp", ref_logp, logp, "logp")
    value: Tensor = _TokenKL.apply(logp, ref_logp.detach(), chosen)
    return value
