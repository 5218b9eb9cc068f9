"""The native `token_kl` kernels: policy_loss's own KL estimator code (`token_kl_and_grad`),
the one implementation policy_loss's native kernel uses."""

from __future__ import annotations

import torch
from torch import Tensor

from rlk.ops.policy_loss.native import token_kl_and_grad
from rlk.ops.policy_loss.options import PolicyLossOptions


def compute_dtype(logp: Tensor, ref_logp: Tensor) -> torch.dtype:
    """float64 when an input is float64, else float32: what the kernels compute and write."""
    return torch.float64 if torch.float64 in (logp.dtype, ref_logp.dtype) else torch.float32


def _value_and_slope(logp: Tensor, ref_logp: Tensor, kl_estimator: str,
                     kl_clamp: float | None) -> tuple[Tensor, Tensor]:
    options = PolicyLossOptions.build(None, {"kl_estimator": kl_estimator,
                                             "kl_clamp": kl_clamp})
    dtype = compute_dtype(logp, ref_logp)
    return token_kl_and_grad(logp.to(dtype), ref_logp.to(dtype), options)


def forward(logp: Tensor, ref_logp: Tensor, kl_estimator: str,
            kl_clamp: float | None) -> tuple[Tensor]:
    return (_value_and_slope(logp, ref_logp, kl_estimator, kl_clamp)[0],)


def backward(grad_value: Tensor, logp: Tensor, ref_logp: Tensor, kl_estimator: str,
             kl_clamp: float | None) -> Tensor:
    slope = _value_and_slope(logp, ref_logp, kl_estimator, kl_clamp)[1]
    return (grad_value * slope).to(logp.dtype)
