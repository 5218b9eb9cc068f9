"""The `policy_loss` kernels: two launches each way, float64 partial sums in a fixed order.

Forward: per-sequence partial sums, then one block applies the aggregation (deterministic).
Backward: per-sequence counts and statistics, then the gradient. `forward.with_grad` (the
optional kernel entry rlk's eager path uses when logp requires grad) does both in one call and
three launches, the backward's statistics summed by the forward's pass. Every input is read in
its own dtype (no conversion launches); the gradient is written in logp's dtype, or float32 at
upstream 1 by `with_grad`. The math follows rlk.ops.policy_loss.native; masked tokens are never
used, so NaN or inf there is harmless.
"""

from __future__ import annotations

import atexit
import functools
from typing import Any

import torch
from rlk.backend import AGGREGATIONS, METRICS, OBJECTIVES, RATIO_LEVELS, PolicyLossOptions
from torch import Tensor

from . import _ext
from ._launch import device_of, dtype_codes, ptr, same_device, stream

FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
MASKS = (*FLOATS, torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
KL_VALUES = ("k1", "k2", "k3", "abs")  # the estimator's value; a "+" takes k2's gradient


@functools.lru_cache(maxsize=256)
def settings(options: PolicyLossOptions) -> Any:
    """The options as the extension's PolicyLossSettings struct, built once per options
    object (None becomes 0, or -inf/+inf for the log-ratio clamp; see rlk_api.h)."""
    return _ext.load().PolicyLossSettings(
        objective=OBJECTIVES.index(options.objective),
        ratio_level=RATIO_LEVELS.index(options.ratio_level),
        clip_low=options.clip_low,
        clip_high=options.clip_high,
        dual_clip=options.dual_clip or 0.0,
        ratio_cap=options.ratio_cap or 0.0,
        log_ratio_min=-float("inf") if options.log_ratio_min is None else options.log_ratio_min,
        log_ratio_max=float("inf") if options.log_ratio_max is None else options.log_ratio_max,
        sapo_temperature_pos=options.sapo_temperature_pos,
        sapo_temperature_neg=options.sapo_temperature_neg,
        vespo_k_pos=options.vespo_k_pos,
        vespo_lambda_pos=options.vespo_lambda_pos,
        vespo_k_neg=options.vespo_k_neg,
        vespo_lambda_neg=options.vespo_lambda_neg,
        kl_coef=options.kl_coef,
        kl_estimator=KL_VALUES.index(options.kl_base),
        kl_straight_through=options.kl_straight_through,
        kl_clamp=options.kl_clamp or 0.0,
        kl_bias_correction=options.kl_bias_correction,
        tis_cap=options.tis_cap or 0.0,
        agg=AGGREGATIONS.index(options.agg),
        divisor=options.divisor or 0.0,
        count_empty_rows=options.count_empty_rows,
        scale=options.scale,
    )


# Cached structs are extension objects: release them before the extension is torn down at
# exit, or nanobind reports them (and the struct type) as leaked.
atexit.register(settings.cache_clear)


def _operand(name: str, tensor: Tensor | None, shapes: tuple[tuple[int, ...], ...],
             where: torch.device, kept: list[Tensor],
             dtypes: tuple[torch.dtype, ...] = FLOATS) -> Any:
    """`tensor` as the extension's Operand (data pointer and element type; null for None),
    contiguous on `where` with one of `shapes`; what it points to stays in `kept` until the
    launch."""
    if tensor is None:
        return _ext.load().Operand(data=0, type=0)
    if tensor.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype {', '.join(map(str, dtypes))} for {__package__}; "
                        f"got {tensor.dtype}")
    if tensor.shape not in shapes:
        raise ValueError(f"{name} must have shape {shapes[0]}; got {tuple(tensor.shape)}")
    if tensor.device != where:
        same_device(name, tensor, where.index)
    tensor = tensor.contiguous()
    kept.append(tensor)
    return _ext.load().Operand(data=tensor.data_ptr(), type=dtype_codes()[tensor.dtype])


def _launch(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
            ref_logp: Tensor | None, rollout_logp: Tensor | None,
            importance_weights: Tensor | None, options: PolicyLossOptions, *,
            loss: Tensor | None = None, metrics: Tensor | None = None,
            grad_loss: Tensor | None = None, grad: Tensor | None = None) -> None:
    """Check the operands (metadata only: these wrappers' host time is most of a small
    call's) and launch the forward (loss and metrics given, and grad too for with_grad) or
    the backward (grad only)."""
    device = device_of("logp", logp)
    if logp.dim() != 2:
        raise ValueError(f"logp must be [B, T]; got shape {tuple(logp.shape)}")
    where = logp.device
    full = logp.shape
    batch, length = full
    per_row = ((batch,), full)
    kept: list[Tensor] = []
    ext = _ext.load()
    rows = torch.empty(batch, ext.POLICY_LOSS_ROW_STATS, dtype=torch.float64, device=where)
    args = ext.PolicyLossArgs(
        logp=_operand("logp", logp, (full,), where, kept),
        old_logp=_operand("old_logp", old_logp, (full,), where, kept),
        advantages=_operand("advantages", advantages, per_row, where, kept),
        mask=_operand("mask", mask, (full,), where, kept, MASKS),
        ref_logp=_operand("ref_logp", ref_logp, (full,), where, kept),
        rollout_logp=_operand("rollout_logp", rollout_logp, (full,), where, kept),
        importance_weights=_operand("importance_weights", importance_weights, per_row, where,
                                    kept),
        B=batch, T=length, adv_per_token=advantages.dim() == 2,
        weights_per_token=importance_weights is not None and importance_weights.dim() == 2,
        s=settings(options),
        rows=rows.data_ptr(),
        loss=ptr(loss), metrics=ptr(metrics), grad_loss=ptr(grad_loss), grad=ptr(grad),
        grad_type=0 if grad is None else dtype_codes()[grad.dtype])
    launch = ext.policy_loss_backward if loss is None else ext.policy_loss_forward
    launch(device=device, stream=stream(device), args=args)


def forward(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
            ref_logp: Tensor | None, rollout_logp: Tensor | None,
            importance_weights: Tensor | None,
            options: PolicyLossOptions) -> tuple[Tensor, Tensor]:
    """The aggregated loss (0-d float32) and metrics (float32, in METRICS order)."""
    # two allocations, not views of one: an op's outputs must not alias each other
    loss = torch.empty((), dtype=torch.float32, device=logp.device)
    metrics = torch.empty(len(METRICS), dtype=torch.float32, device=logp.device)
    _launch(logp, old_logp, advantages, mask, ref_logp, rollout_logp, importance_weights,
            options, loss=loss, metrics=metrics)
    return loss, metrics


def with_grad(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
              ref_logp: Tensor | None, rollout_logp: Tensor | None,
              importance_weights: Tensor | None,
              options: PolicyLossOptions) -> tuple[Tensor, Tensor, Tensor]:
    """The forward's loss and metrics, and d loss / d logp at upstream 1 in float32 [B, T]:
    `backward(grad_loss, ...)` equals it times grad_loss rounded to logp's dtype, bit for bit
    (but for results below float32's normal range, which the kernels flush to zero)."""
    loss = torch.empty((), dtype=torch.float32, device=logp.device)
    metrics = torch.empty(len(METRICS), dtype=torch.float32, device=logp.device)
    grad = torch.empty(logp.shape, dtype=torch.float32, device=logp.device)
    _launch(logp, old_logp, advantages, mask, ref_logp, rollout_logp, importance_weights,
            options, loss=loss, metrics=metrics, grad=grad)
    return loss, metrics, grad


forward.with_grad = with_grad  # type: ignore[attr-defined]


def backward(grad_loss: Tensor, logp: Tensor, old_logp: Tensor, advantages: Tensor,
             mask: Tensor, ref_logp: Tensor | None, rollout_logp: Tensor | None,
             importance_weights: Tensor | None, options: PolicyLossOptions) -> Tensor:
    """d(loss * grad_loss) / d logp, [B, T] in logp's dtype (zero at masked tokens)."""
    if grad_loss.device != logp.device:
        same_device("grad_loss", grad_loss, device_of("logp", logp))
    upstream = grad_loss if grad_loss.dtype == torch.float32 else grad_loss.float()
    if upstream.numel() != 1:
        raise ValueError(f"grad_loss must hold one value; got shape {tuple(grad_loss.shape)}")
    grad = torch.empty(logp.shape, dtype=logp.dtype, device=logp.device)
    _launch(logp, old_logp, advantages, mask, ref_logp, rollout_logp, importance_weights,
            options, grad_loss=upstream, grad=grad)
    return grad
