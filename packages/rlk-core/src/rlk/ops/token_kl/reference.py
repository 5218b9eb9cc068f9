"""The float64 reference of `token_kl`."""

from __future__ import annotations

import torch


def token_kl(logp: torch.Tensor, ref_logp: torch.Tensor, kl_estimator: str,
             kl_clamp: float | None) -> torch.Tensor:
    """Each token's KL estimate from delta = logp - ref_logp, in float64, as Schulman (2020)
    and verl's kl_penalty define the estimators; a "+" estimator keeps its value and takes
    k2's gradient (written so that autograd gives it)."""
    delta = logp.to(torch.float64) - ref_logp.detach().to(torch.float64)
    value = {"k1": lambda: delta, "k2": lambda: 0.5 * delta.square(),
             "k3": lambda: torch.exp(-delta) + delta - 1.0,
             "abs": lambda: delta.abs()}[kl_estimator.rstrip("+")]()
    if kl_clamp is not None:
        value = value.clamp(-kl_clamp, kl_clamp)
    if kl_estimator.endswith("+"):
        square = 0.5 * delta.square()
        value = square - square.detach() + value.detach()
    return value
