"""`policy_loss`: the PPO-family clipped surrogate with KL, GSPO and TIS options.

One op covers PPO, GRPO, DAPO, Dr. GRPO and GSPO (see docs/ops/policy_loss.md for
the formulas and which settings match which method). Differentiable w.r.t. `logp`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from rlk import reference
from rlk.ops import validate
from rlk.ops.contract import BoundKernel, Out
from rlk.ops.spec import GradCase, NativeKernel, OpSpec, Sample, Tolerance, register_autograd

KL_ESTIMATORS = ("k1", "k2", "k3")
RATIO_LEVELS = ("token", "sequence")
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                "seq-mean-token-sum-norm")
METRICS = ("clip_fraction", "mean_ratio", "mean_kl", "truncated_fraction")
_TENSORS = ("logp", "old_logp", "advantages", "mask", "ref_logp", "rollout_logp")


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}")
    return str(value)


def _number(name: str, value: object, low: float, *, strict: bool = False,
            below: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    number = float(value)
    fits = (number > low if strict else number >= low) and number < below
    if not fits or not math.isfinite(number):
        upper = "" if below == math.inf else f" and < {below}"
        bound = f"{'>' if strict else '>='} {low}{upper}"
        raise ValueError(f"{name} must be finite and {bound}; got {value}")
    return number


def _companion(name: str, value: Tensor, logp: Tensor) -> Tensor:
    validate.tensor(name, value, (*validate.FLOATS, torch.float64))
    validate.shape(name, value, tuple(logp.shape), " (the shape of logp)")
    validate.same_device(name, value, logp, "logp")
    return value.to(torch.float32)


def _prepare(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
             ref_logp: Tensor | None, rollout_logp: Tensor | None, clip_low: float,
             clip_high: float, dual_clip: float | None, kl_coef: float, kl_estimator: str,
             ratio_level: str, agg: str, tis_cap: float | None) -> dict[str, Any]:
    """Validate public arguments into kernel arguments (float32 tensors, mask as 0/1)."""
    validate.tensor("logp", logp, (torch.float32,))
    if logp.dim() != 2:
        raise ValueError(f"logp must be [B, T]; got shape {tuple(logp.shape)}")
    validate.tensor("mask", mask, (torch.bool, *validate.FLOATS, torch.float64))
    validate.shape("mask", mask, tuple(logp.shape), " (the shape of logp)")
    validate.same_device("mask", mask, logp, "logp")
    validate.tensor("advantages", advantages, (*validate.FLOATS, torch.float64))
    if tuple(advantages.shape) not in (tuple(logp.shape[:1]), tuple(logp.shape)):
        raise ValueError(f"advantages must have shape {tuple(logp.shape[:1])} (one per "
                         f"sequence) or {tuple(logp.shape)} (one per token); "
                         f"got {tuple(advantages.shape)}")
    validate.same_device("advantages", advantages, logp, "logp")
    if kl_coef != 0.0 and ref_logp is None:
        raise ValueError(f"kl_coef={kl_coef} needs ref_logp (the reference policy's logp)")
    if tis_cap is not None and rollout_logp is None:
        raise ValueError("tis_cap needs rollout_logp (the rollout engine's logp)")
    return {
        "logp": logp,
        "old_logp": _companion("old_logp", old_logp, logp),
        "advantages": advantages.to(torch.float32),
        "mask": (mask != 0).to(torch.float32),
        "ref_logp": None if ref_logp is None else _companion("ref_logp", ref_logp, logp),
        "rollout_logp": (None if rollout_logp is None
                         else _companion("rollout_logp", rollout_logp, logp)),
        "clip_low": _number("clip_low", clip_low, 0.0, below=1.0),
        "clip_high": _number("clip_high", clip_high, 0.0),
        "dual_clip": None if dual_clip is None else _number("dual_clip", dual_clip, 1.0,
                                                            strict=True),
        "kl_coef": _number("kl_coef", kl_coef, 0.0),
        "kl_estimator": _choice("kl_estimator", kl_estimator, KL_ESTIMATORS),
        "ratio_level": _choice("ratio_level", ratio_level, RATIO_LEVELS),
        "agg": _choice("agg", agg, AGGREGATIONS),
        "tis_cap": None if tis_cap is None else _number("tis_cap", tis_cap, 0.0, strict=True),
    }


def _flags(args: Mapping[str, Any]) -> tuple[Any, ...]:
    return (args["ref_logp"] is not None, args["rollout_logp"] is not None,
            args["ratio_level"], args["agg"], args["kl_estimator"])


def _options(args: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in args.items() if key not in _TENSORS}


def _kernel_args(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
                 ref_logp: Tensor | None, rollout_logp: Tensor | None, clip_low: float,
                 clip_high: float, dual_clip: float | None, kl_coef: float, kl_estimator: str,
                 ratio_level: str, agg: str, tis_cap: float | None) -> dict[str, Any]:
    return dict(logp=logp, old_logp=old_logp, advantages=advantages, mask=mask,
                ref_logp=ref_logp, rollout_logp=rollout_logp, clip_low=clip_low,
                clip_high=clip_high, dual_clip=dual_clip, kl_coef=kl_coef,
                kl_estimator=kl_estimator, ratio_level=ratio_level, agg=agg, tis_cap=tis_cap)


# ---------------------------------------------------------------------------
# torch operators


@torch.library.custom_op("rlk::policy_loss", mutates_args=())
def _policy_loss_op(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
                    ref_logp: Tensor | None, rollout_logp: Tensor | None, clip_low: float,
                    clip_high: float, dual_clip: float | None, kl_coef: float,
                    kl_estimator: str, ratio_level: str, agg: str,
                    tis_cap: float | None) -> tuple[Tensor, Tensor]:
    args = _kernel_args(logp, old_logp, advantages, mask, ref_logp, rollout_logp, clip_low,
                        clip_high, dual_clip, kl_coef, kl_estimator, ratio_level, agg, tis_cap)
    loss, metrics = POLICY_LOSS.kernel(args).forward(
        *(args[name] for name in _TENSORS), **_options(args)
    )
    return loss, metrics


@torch.library.custom_op("rlk::policy_loss_backward", mutates_args=())
def _policy_loss_backward_op(grad_loss: Tensor, logp: Tensor, old_logp: Tensor,
                             advantages: Tensor, mask: Tensor, ref_logp: Tensor | None,
                             rollout_logp: Tensor | None, clip_low: float, clip_high: float,
                             dual_clip: float | None, kl_coef: float, kl_estimator: str,
                             ratio_level: str, agg: str, tis_cap: float | None) -> Tensor:
    args = _kernel_args(logp, old_logp, advantages, mask, ref_logp, rollout_logp, clip_low,
                        clip_high, dual_clip, kl_coef, kl_estimator, ratio_level, agg, tis_cap)
    return POLICY_LOSS.kernel(args).backward(
        grad_loss, *(args[name] for name in _TENSORS), **_options(args)
    )


@_policy_loss_op.register_fake
def _(logp, old_logp, advantages, mask, ref_logp, rollout_logp, clip_low, clip_high,
      dual_clip, kl_coef, kl_estimator, ratio_level, agg, tis_cap):
    return logp.new_empty(()), logp.new_empty(len(METRICS))


@_policy_loss_backward_op.register_fake
def _(grad_loss, logp, old_logp, advantages, mask, ref_logp, rollout_logp, clip_low,
      clip_high, dual_clip, kl_coef, kl_estimator, ratio_level, agg, tis_cap):
    return torch.empty_like(logp)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    ctx.save_for_backward(*inputs[:6])
    ctx.options = inputs[6:]


def _grad(ctx: Any, grad_loss: Tensor, grad_metrics: Tensor) -> tuple[Tensor | None, ...]:
    grad = _policy_loss_backward_op(grad_loss, *ctx.saved_tensors, *ctx.options)
    return (grad,) + (None,) * 13


register_autograd(_policy_loss_op, _grad, _setup)


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    ref_logp: Tensor | None = None,
    rollout_logp: Tensor | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    ratio_level: str = "token",
    agg: str = "token-mean",
    tis_cap: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The clipped policy-gradient loss (a 0-d float32 tensor) and detached metrics.

    logp (float32, differentiable), old_logp, mask (nonzero = a real token) and the
    optional ref_logp / rollout_logp are `[B, T]`; advantages `[B]` or `[B, T]`.
    Options: PPO clip range (1 - clip_low, 1 + clip_high); dual_clip (> 1) bounds
    the loss of negative advantages; kl_coef * KL(k1/k2/k3) against ref_logp;
    ratio_level "sequence" (GSPO); tis_cap truncates the importance weight
    exp(old_logp - rollout_logp); agg picks the aggregation. Metrics are token means
    over the mask: clip_fraction, mean_ratio, mean_kl, truncated_fraction.
    """
    args = _prepare(logp, old_logp, advantages, mask, ref_logp, rollout_logp, clip_low,
                    clip_high, dual_clip, kl_coef, kl_estimator, ratio_level, agg, tis_cap)
    loss, metrics = _policy_loss_op(**args)
    values = metrics.detach()
    return loss, {name: values[index] for index, name in enumerate(METRICS)}


# ---------------------------------------------------------------------------
# conformance samples and the spec


def _samples(device: torch.device, dtype: torch.dtype) -> Iterator[Sample]:
    gen = torch.Generator().manual_seed(31)

    def case(name: str, batch: int = 4, length: int = 9, per_token: bool = False,
             ref: bool = False, rollout: bool = False, spread: float = 0.25,
             **options: Any) -> Sample:
        def logps() -> Tensor:
            return -torch.rand(batch, length, generator=gen) * 3

        logp = logps()
        old = logp + torch.randn(batch, length, generator=gen) * spread
        mask = (torch.rand(batch, length, generator=gen) > 0.25).float()
        mask[:1] = 1.0
        adv_shape = (batch, length) if per_token else (batch,)
        args = _kernel_args(
            logp.to(device), old.to(device), torch.randn(*adv_shape, generator=gen).to(device),
            mask.to(device),
            (logp + torch.randn(batch, length, generator=gen) * 0.3).to(device) if ref else None,
            (old + torch.randn(batch, length, generator=gen) * 0.4).to(device) if rollout
            else None,
            0.2, 0.2, None, 0.0, "k3", "token", "token-mean", None,
        )
        args.update(options)
        return Sample(name, args)

    yield case("ppo")
    for agg in AGGREGATIONS[1:]:
        yield case(agg, agg=agg)
    yield case("dapo-clip-higher", clip_high=0.28)
    sample = case("dual-clip", dual_clip=2.0, clip_low=0.1, clip_high=0.1, spread=1.0)
    sample.args["advantages"][1] = -1.0  # ratios above dual_clip with a negative advantage
    sample.args["old_logp"][1] = sample.args["logp"][1] - 1.5
    yield sample
    for estimator in KL_ESTIMATORS:
        yield case(f"kl-{estimator}", ref=True, kl_coef=0.05, kl_estimator=estimator,
                   agg="seq-mean-token-mean")
    yield case("kl-metric-only", ref=True)
    yield case("gspo", ratio_level="sequence", clip_low=0.03, clip_high=0.04,
               agg="seq-mean-token-mean")
    yield case("gspo-token-mean", ratio_level="sequence", clip_low=0.03, clip_high=0.04,
               per_token=True)
    yield case("tis", rollout=True, tis_cap=1.2)
    yield case("is-uncapped", rollout=True, agg="seq-mean-token-sum")
    yield case("per-token-advantages", per_token=True, dual_clip=2.0, spread=1.0)
    sample = case("masked-garbage", ref=True, kl_coef=0.1)
    sample.args["logp"][1, 2] = float("nan")
    sample.args["old_logp"][2, 3] = float("inf")
    sample.args["mask"][1, 2] = sample.args["mask"][2, 3] = 0.0
    yield sample
    sample = case("empty-sequence", agg="seq-mean-token-mean")
    sample.args["mask"][3] = 0.0
    yield sample
    yield case("empty", batch=0, length=5, agg="seq-mean-token-mean")


def _public_prepare(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
                    **options: Any) -> dict[str, Any]:
    defaults: dict[str, Any] = dict(ref_logp=None, rollout_logp=None, clip_low=0.2,
                                    clip_high=0.2, dual_clip=None, kl_coef=0.0,
                                    kl_estimator="k3", ratio_level="token", agg="token-mean",
                                    tis_cap=None)
    unknown = set(options) - set(defaults)
    if unknown:
        raise TypeError(f"policy_loss got unexpected keyword arguments {sorted(unknown)}")
    defaults.update(options)
    return _prepare(logp, old_logp, advantages, mask, **defaults)


def _reference(args: Mapping[str, Any]) -> tuple[Tensor, ...]:
    return reference.policy_loss(*(args[name] for name in _TENSORS[:4]), **_reference_options(args))


def _reference_options(args: Mapping[str, Any]) -> dict[str, Any]:
    return dict(_options(args), ref_logp=args["ref_logp"], rollout_logp=args["rollout_logp"])


def _grad_check(kernel: BoundKernel, args: dict[str, Any],
                gen: torch.Generator) -> Iterator[GradCase]:
    """The kernel's backward against autograd through the float64 reference."""
    grad_loss = (torch.rand((), generator=gen) + 0.5).to(args["logp"].device)
    leaf = args["logp"].detach().to(torch.float64).requires_grad_(True)
    loss, _ = reference.policy_loss(leaf, *(args[name] for name in _TENSORS[1:4]),
                                    **_reference_options(args))
    (expected,) = torch.autograd.grad(loss * grad_loss.double(), leaf)
    got = kernel.backward(grad_loss, *(args[name] for name in _TENSORS), **_options(args))
    yield "grad_logp", got, expected


def _opcheck_case(args: dict[str, Any]) -> tuple[Any, tuple[Any, ...]]:
    logp = args["logp"].detach().clone().requires_grad_(True)
    rest = [args[name] for name in _TENSORS[1:]] + list(_options(args).values())
    return torch.ops.rlk.policy_loss.default, (logp, *rest)


def _output_meta(logp: Tensor, *_: Any, **__: Any) -> tuple[Out | None, ...]:
    return Out((), torch.float32, logp.device), Out((len(METRICS),), torch.float32, logp.device)


def _grad_meta(grad_loss: Tensor, logp: Tensor, *_: Any, **__: Any) -> tuple[Out | None, ...]:
    return (Out(tuple(logp.shape), torch.float32, logp.device),)


def _shape_call(shape: Any, dtype: torch.dtype) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if len(shape) != 2:
        raise ValueError(f"takes --shape B,T; got {shape}")
    logp = torch.empty(shape, dtype=dtype, device="meta")
    return (logp, logp, torch.empty(shape[0], device="meta"), logp), {}


POLICY_LOSS = OpSpec(
    name="policy_loss",
    main_input="logp",
    prepare=_public_prepare,
    flags=_flags,
    reference=_reference,
    outputs=lambda result, args: tuple(result),
    samples=_samples,
    tolerances={torch.float32: Tolerance(atol=1e-5, rtol=1e-5)},
    dtypes=(torch.float32,),
    opcheck_case=_opcheck_case,
    grad_check=_grad_check,
    grad_tolerances={torch.float32: Tolerance(atol=1e-6, rtol=1e-5)},
    doc="PPO / GRPO / DAPO / Dr. GRPO / GSPO clipped policy loss",
    native=NativeKernel("rlk.native.policy_loss:forward", "rlk.native.policy_loss:backward"),
    output_meta=_output_meta,
    grad_meta=_grad_meta,
    shape_call=_shape_call,
    shape_help="B,T",
)
