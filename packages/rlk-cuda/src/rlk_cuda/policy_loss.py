"""The `policy_loss` kernels: two launches each way, float64 partial sums in a fixed order.

Forward: per-sequence partial sums, then one block applies the aggregation (deterministic).
Backward: per-sequence token counts (and GSPO slope sums), then the gradient. The math follows
rlk.native.policy_loss; masked tokens are never used, so NaN or inf there is harmless.
"""

from __future__ import annotations

import torch
from rlk.backend import AGGREGATIONS, KL_ESTIMATORS, RATIO_LEVELS
from torch import Tensor

from . import _ext
from ._launch import device_of, f32_empty, ptr, same_device, stream

Settings = tuple[float, float, float, float, int, bool, int, float]


def _index(name: str, value: str, allowed: tuple[str, ...]) -> int:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}; got {value!r}")
    return allowed.index(value)


def _settings(clip_low: float, clip_high: float, dual_clip: float | None, kl_coef: float,
              kl_estimator: str, ratio_level: str, agg: str, tis_cap: float | None) -> Settings:
    """The options as the extension takes them (0 stands for an absent dual_clip / tis_cap)."""
    return (1.0 - clip_low, 1.0 + clip_high, 0.0 if dual_clip is None else dual_clip, kl_coef,
            _index("kl_estimator", kl_estimator, KL_ESTIMATORS) + 1,
            _index("ratio_level", ratio_level, RATIO_LEVELS) == 1,
            _index("agg", agg, AGGREGATIONS), 0.0 if tis_cap is None else tis_cap)


def _operand(name: str, tensor: Tensor | None, shapes: tuple[tuple[int, ...], ...],
             device: int) -> Tensor | None:
    """`tensor` as contiguous float32 on `device` with one of `shapes` (None stays None)."""
    if tensor is None:
        return None
    if tensor.dtype != torch.float32:
        raise TypeError(f"{name} must be float32 for {__package__}; got {tensor.dtype}")
    if tuple(tensor.shape) not in shapes:
        raise ValueError(f"{name} must have shape {shapes[0]}; got {tuple(tensor.shape)}")
    same_device(name, tensor, device)
    return tensor.contiguous()


def _launch(inputs: tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None, Tensor | None],
            settings: Settings, *, loss: Tensor | None = None, metrics: Tensor | None = None,
            grad_loss: Tensor | None = None, grad: Tensor | None = None) -> None:
    logp, old_logp, advantages, mask, ref_logp, rollout_logp = inputs
    device = device_of("logp", logp)
    if grad_loss is not None:
        same_device("grad_loss", grad_loss, device)
    if logp.dim() != 2:
        raise ValueError(f"logp must be [B, T]; got shape {tuple(logp.shape)}")
    batch, length = logp.shape
    full = ((batch, length),)
    tensors = [
        _operand("logp", logp, full, device),
        _operand("old_logp", old_logp, full, device),
        _operand("advantages", advantages, ((batch,), (batch, length)), device),
        _operand("mask", mask, full, device),
        _operand("ref_logp", ref_logp, full, device),
        _operand("rollout_logp", rollout_logp, full, device),
    ]
    ext = _ext.load()
    rows = torch.empty(batch, ext.POLICY_LOSS_ROW_STATS, dtype=torch.float64,
                       device=logp.device)
    ext.policy_loss(grad is not None, device, stream(device), *(ptr(t) for t in tensors),
                    batch, length, advantages.dim() == 2, *settings, ptr(rows), ptr(loss),
                    ptr(metrics), ptr(grad_loss), ptr(grad))


def forward(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
            ref_logp: Tensor | None, rollout_logp: Tensor | None, *, clip_low: float,
            clip_high: float, dual_clip: float | None, kl_coef: float, kl_estimator: str,
            ratio_level: str, agg: str, tis_cap: float | None) -> tuple[Tensor, Tensor]:
    """The aggregated loss (0-d) and metrics [clip_fraction, mean_ratio, mean_kl, truncated]."""
    settings = _settings(clip_low, clip_high, dual_clip, kl_coef, kl_estimator, ratio_level,
                         agg, tis_cap)
    loss, metrics = f32_empty(device=logp.device), f32_empty(4, device=logp.device)
    _launch((logp, old_logp, advantages, mask, ref_logp, rollout_logp), settings, loss=loss,
            metrics=metrics)
    return loss, metrics


def backward(grad_loss: Tensor, logp: Tensor, old_logp: Tensor, advantages: Tensor,
             mask: Tensor, ref_logp: Tensor | None, rollout_logp: Tensor | None, *,
             clip_low: float, clip_high: float, dual_clip: float | None, kl_coef: float,
             kl_estimator: str, ratio_level: str, agg: str, tis_cap: float | None) -> Tensor:
    """d(loss * grad_loss) / d logp, [B, T] float32 (zero at masked tokens)."""
    settings = _settings(clip_low, clip_high, dual_clip, kl_coef, kl_estimator, ratio_level,
                         agg, tis_cap)
    upstream = grad_loss.to(torch.float32).reshape(())
    grad = f32_empty(*logp.shape, device=logp.device)
    _launch((logp, old_logp, advantages, mask, ref_logp, rollout_logp), settings,
            grad_loss=upstream, grad=grad)
    return grad
