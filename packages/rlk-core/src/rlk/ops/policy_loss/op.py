"""`policy_loss`: the policy-gradient loss of PPO, GRPO, DAPO, Dr. GRPO, GSPO, CISPO, SAPO,
VESPO and their KL, importance-sampling and normalisation variants, as one op.

Every setting is a field of `PolicyLossOptions` (its default and its validation live there);
docs/ops/policy_loss.md defines each by its formula and its source. Differentiable w.r.t.
`logp` only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from rlk._runtime import kernel_checks, validate
from rlk._runtime.contract import BoundKernel, Out, attribute, check
from rlk._runtime.operator import Grads, Operator
from rlk._runtime.signature import Signature, options_param, plain
from rlk._runtime.spec import GradCase, NativeKernel, OpSpec, Tolerance
from rlk.ops.policy_loss import reference
from rlk.ops.policy_loss.options import METRICS, PolicyLossOptions
from rlk.ops.policy_loss.samples import samples

FLOATS = validate.ANY_FLOAT
MASKS = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, *FLOATS)
TENSORS = ("logp", "old_logp", "advantages", "mask", "ref_logp", "rollout_logp",
           "importance_weights")


def _beside(name: str, value: Tensor, dtypes: tuple[torch.dtype, ...],
            shapes: tuple[tuple[int, ...], ...], logp: Tensor) -> None:
    """Check a tensor beside logp: one of `dtypes` and `shapes`, on logp's device. A few
    attribute reads when it is right (this runs on every call); the message when not."""
    if not isinstance(value, Tensor) or value.dtype not in dtypes:
        validate.tensor(name, value, dtypes)
    if value.shape not in shapes:
        validate.shape(name, value, shapes[0], " (the shape of logp)")
    if value.device != logp.device:
        validate.same_device(name, value, logp, "logp")


def _per_sequence_or_token(name: str, value: Tensor | None, logp: Tensor) -> Tensor | None:
    """[B] (one per sequence), [B, 1] (viewed as [B]) or [B, T] (one per token)."""
    if value is None:
        return None
    batch, length = logp.shape
    if not isinstance(value, Tensor) or value.dtype not in FLOATS:
        validate.tensor(name, value, FLOATS)
    shape = value.shape
    if shape != (batch,) and shape != logp.shape:
        if shape != (batch, 1):
            raise ValueError(f"{name} must have shape ({batch},) or ({batch}, 1) (one per "
                             f"sequence) or ({batch}, {length}) (one per token); got "
                             f"{tuple(shape)}")
        value = value.reshape(batch)
    if value.device != logp.device:
        validate.same_device(name, value, logp, "logp")
    return value


def _prepare(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
             ref_logp: Tensor | None, rollout_logp: Tensor | None,
             importance_weights: Tensor | None, options: PolicyLossOptions) -> dict[str, Any]:
    """Validate the public arguments into kernel arguments: dtypes are kept (kernels read
    each in its own dtype), [B, 1] becomes [B]; nothing is copied."""
    if not isinstance(logp, Tensor) or logp.dtype not in FLOATS:
        validate.tensor("logp", logp, FLOATS)
    if logp.dim() != 2:
        raise ValueError(f"logp must be [B, T]; got shape {tuple(logp.shape)}")
    full = (logp.shape,)
    _beside("old_logp", old_logp, FLOATS, full, logp)
    _beside("mask", mask, MASKS, full, logp)
    for name, value in (("ref_logp", ref_logp), ("rollout_logp", rollout_logp)):
        if value is not None:
            _beside(name, value, FLOATS, full, logp)
    if options.kl_coef != 0.0 or options.kl_clamp is not None or options.kl_bias_correction:
        _need_ref(options, ref_logp)
    if options.tis_cap is not None and rollout_logp is None:
        raise ValueError("tis_cap needs rollout_logp (the rollout engine's logp)")
    return {
        "logp": logp,
        "old_logp": old_logp,
        "advantages": _per_sequence_or_token("advantages", advantages, logp),
        "mask": mask,
        "ref_logp": ref_logp,
        "rollout_logp": rollout_logp,
        "importance_weights": _per_sequence_or_token("importance_weights", importance_weights,
                                                     logp),
        "options": options,
    }


def _need_ref(options: PolicyLossOptions, ref_logp: Tensor | None) -> None:
    """ValueError when a KL setting is on and there is no ref_logp."""
    needs_ref = [name for name, on in (("kl_coef", options.kl_coef != 0.0),
                                       ("kl_clamp", options.kl_clamp is not None),
                                       ("kl_bias_correction", options.kl_bias_correction)) if on]
    if needs_ref and ref_logp is None:
        value = getattr(options, needs_ref[0])
        raise ValueError(f"{needs_ref[0]}={value} needs ref_logp (the reference policy's logp)")


def _flags(args: Mapping[str, Any]) -> tuple[Any, ...]:
    return (args["ref_logp"] is not None, args["rollout_logp"] is not None,
            args["importance_weights"] is not None, args["advantages"].dim(),
            args["options"].choices())


# ---------------------------------------------------------------------------
# the torch operator: the options flattened into scalars, as compile and export need

SIGNATURE = Signature((*(plain(name, "Tensor") for name in TENSORS[:4]),
                       *(plain(name, "Tensor?") for name in TENSORS[4:]),
                       options_param("options", PolicyLossOptions)))


def _backward(kernel: BoundKernel, args: Mapping[str, Any], grads: Grads,
              needs: tuple[bool, ...]) -> Grads:
    grad_loss = grads[0] if grads[0] is not None else args["logp"].new_zeros(())
    return (kernel.backward(grad_loss, **args),)


def _forward_with_grad(kernel: BoundKernel,
                       args: Mapping[str, Any]) -> tuple[tuple[Tensor, Tensor],
                                                         tuple[Tensor, torch.dtype]] | None:
    """Loss, metrics and d loss / d logp at upstream 1 (float32) from the kernel's optional
    `forward.with_grad` entry, checked against the contract; None when it has none."""
    with_grad = getattr(kernel.kernel.forward, "with_grad", None)
    if with_grad is None:
        return None
    try:
        result = with_grad(**args)
    except Exception as exc:
        attribute(exc, kernel.kernel, "forward")
        raise
    logp = args["logp"]
    check(kernel.kernel, "forward.with_grad", result,
          (*_output_meta(logp), Out(tuple(logp.shape), torch.float32, logp.device)))
    loss, metrics, grad = result
    return (loss, metrics), (grad, logp.dtype)


def _scaled_grad(state: tuple[Tensor, torch.dtype],
                 grads: tuple[Tensor | None, ...]) -> tuple[Tensor]:
    """The saved gradient times the upstream one, rounded once to logp's dtype: what the
    kernel's backward computes (out of place: a retained graph may run its backward again)."""
    grad, dtype = state
    upstream = grads[0] if grads[0] is not None else grad.new_zeros(())
    if dtype == torch.float32:
        return (grad * upstream,)
    return (torch.mul(grad, upstream, out=torch.empty(grad.shape, dtype=dtype,
                                                      device=grad.device)),)


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    ref_logp: Tensor | None = None,
    rollout_logp: Tensor | None = None,
    importance_weights: Tensor | None = None,
    options: PolicyLossOptions | None = None,
    **settings: Any,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The policy loss (a 0-d float32 tensor, differentiable w.r.t. logp) and detached metrics.

    logp (any float dtype; computed in float32, its gradient in its dtype), old_logp and
    the optional ref_logp / rollout_logp are [B, T]; mask [B, T] of any dtype (nonzero =
    a real token); advantages and the optional importance_weights (a detached weight on
    each token's policy term, e.g. TRL's or verl's rollout correction) [B], [B, 1] or
    [B, T]. Settings are `PolicyLossOptions` fields, given as `options=` and/or keywords
    (keywords win): `rlk.policy_loss(logp, old, adv, mask, clip_high=0.28)`. Metrics, by
    name: clip_fraction, clip_low_fraction, clip_high_fraction, dual_clip_fraction,
    mean_ratio, mean_kl, truncated_fraction.
    """
    chosen = PolicyLossOptions.build(options, settings)
    args = _prepare(logp, old_logp, advantages, mask, ref_logp, rollout_logp,
                    importance_weights, chosen)
    loss, metrics = POLICY_LOSS.call(args)
    return loss, dict(zip(METRICS, metrics.detach().unbind(), strict=True))


# ---------------------------------------------------------------------------
# the spec


def _public_prepare(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *,
                    ref_logp: Tensor | None = None, rollout_logp: Tensor | None = None,
                    importance_weights: Tensor | None = None,
                    options: PolicyLossOptions | None = None, **settings: Any) -> dict[str, Any]:
    return _prepare(logp, old_logp, advantages, mask, ref_logp, rollout_logp,
                    importance_weights, PolicyLossOptions.build(options, settings))


def _reference(args: Mapping[str, Any]) -> tuple[Tensor, ...]:
    return reference.policy_loss(*(args[name] for name in TENSORS[:4]),
                                 **{name: args[name] for name in (*TENSORS[4:], "options")})


def _grad_check(kernel: BoundKernel, args: dict[str, Any],
                gen: torch.Generator) -> Iterator[GradCase]:
    """The kernel's backward against autograd through the float64 reference, and the eager
    path's gradient from `forward.with_grad` when the kernel has one."""
    grad_loss = (torch.rand((), generator=gen) + 0.5).to(args["logp"].device)
    leaf = args["logp"].detach().to(torch.float64).requires_grad_(True)
    loss, _ = _reference({**args, "logp": leaf})
    (expected,) = torch.autograd.grad(loss * grad_loss.double(), leaf, allow_unused=True)
    expected = torch.zeros_like(leaf) if expected is None else expected
    yield "grad_logp", kernel.backward(grad_loss, **args), expected
    fused = _forward_with_grad(kernel, args)
    if fused is not None:
        (scaled,) = _scaled_grad(fused[1], (grad_loss,))
        yield "grad_logp from forward.with_grad", scaled, expected


def _opcheck_case(args: dict[str, Any]) -> tuple[Any, tuple[Any, ...]]:
    logp = args["logp"].detach().clone().requires_grad_(True)
    return torch.ops.rlk.policy_loss.default, SIGNATURE.encode({**args, "logp": logp})


def _output_meta(logp: Tensor, *_: Any, **__: Any) -> tuple[Out | None, ...]:
    return Out((), torch.float32, logp.device), Out((len(METRICS),), torch.float32, logp.device)


def _grad_meta(grad_loss: Tensor, logp: Tensor, *_: Any, **__: Any) -> tuple[Out | None, ...]:
    return (Out(tuple(logp.shape), logp.dtype, logp.device),)


def _shape_call(shape: Any, dtype: torch.dtype) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if len(shape) != 2:
        raise ValueError(f"takes --shape B,T; got {shape}")
    logp = torch.empty(shape, dtype=dtype, device="meta")
    return (logp, logp, torch.empty(shape[0], device="meta"), logp), {}


_LOSS_TOLERANCE = Tolerance(atol=1e-5, rtol=1e-5)
POLICY_LOSS = OpSpec(
    name="policy_loss",
    main_input="logp",
    prepare=_public_prepare,
    flags=_flags,
    reference=_reference,
    outputs=lambda result, args: tuple(result),
    samples=samples,
    tolerances=dict.fromkeys(FLOATS, _LOSS_TOLERANCE),
    dtypes=FLOATS,
    opcheck_case=_opcheck_case,
    grad_check=_grad_check,
    grad_tolerances={torch.float32: Tolerance(atol=1e-6, rtol=1e-5),
                     torch.float64: Tolerance(atol=1e-6, rtol=1e-5),
                     torch.bfloat16: Tolerance(atol=1e-6, rtol=8e-3),
                     torch.float16: Tolerance(atol=1e-6, rtol=1e-3)},
    operator=Operator(SIGNATURE, returns=("Tensor", "Tensor"), grad_inputs=("logp",),
                      backward=_backward, detached_outputs=(1,),
                      forward_with_grads=_forward_with_grad, backward_from=_scaled_grad),
    doc="PPO / GRPO / DAPO / Dr. GRPO / GSPO / CISPO / SAPO / VESPO policy loss",
    native=NativeKernel("rlk.ops.policy_loss.native:forward",
                        "rlk.ops.policy_loss.native:backward"),
    output_meta=_output_meta,
    grad_meta=_grad_meta,
    shape_call=_shape_call,
    shape_help="B,T",
    nan_rule=kernel_checks.finite_inputs_rule,
)
