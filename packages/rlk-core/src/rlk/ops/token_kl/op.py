"""`token_kl`: each token's KL estimate between the policy and a reference policy.

The per-token term `policy_loss` adds to its loss (before `kl_coef`), for a caller that
aggregates or logs it itself (verl's `kl_penalty`, a KL reward penalty). Its settings are
`PolicyLossOptions`' `kl_estimator` and `kl_clamp`; its native kernel is policy_loss's own
estimator code.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from rlk._runtime import validate
from rlk._runtime.contract import BoundKernel, Out
from rlk._runtime.operator import Grads, Operator
from rlk._runtime.signature import Signature, plain
from rlk._runtime.spec import GradCase, NativeKernel, OpSpec, Sample, Tolerance
from rlk.ops.logp.op import grad_expected
from rlk.ops.policy_loss.options import KL_ESTIMATORS, PolicyLossOptions
from rlk.ops.token_kl import reference
from rlk.ops.token_kl.native import compute_dtype

FLOATS = validate.ANY_FLOAT
SETTINGS = ("kl_estimator", "kl_clamp")


def _prepare(logp: Tensor, ref_logp: Tensor, options: PolicyLossOptions | None,
             settings: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise TypeError(f"token_kl takes the settings {', '.join(SETTINGS)} (or options=); "
                        f"got {', '.join(unknown)}")
    chosen = PolicyLossOptions.build(options, settings)
    if chosen.kl_bias_correction:
        raise ValueError("kl_bias_correction multiplies the KL by the policy ratio, which "
                         "needs old_logp: use policy_loss")
    validate.tensor("logp", logp, FLOATS)
    validate.tensor("ref_logp", ref_logp, FLOATS)
    validate.shape("ref_logp", ref_logp, tuple(logp.shape), " (the shape of logp)")
    validate.same_device("ref_logp", ref_logp, logp, "logp")
    return {"logp": logp, "ref_logp": ref_logp.detach(), "kl_estimator": chosen.kl_estimator,
            "kl_clamp": chosen.kl_clamp}


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
    result: Tensor = TOKEN_KL.call(_prepare(logp, ref_logp, options, settings))[0]
    return result


# ---------------------------------------------------------------------------
# the torch operator

SIGNATURE = Signature((plain("logp", "Tensor"), plain("ref_logp", "Tensor"),
                       plain("kl_estimator", "str"), plain("kl_clamp", "float?")))


def _backward(kernel: BoundKernel, args: Mapping[str, Any], grads: Grads,
              needs: tuple[bool, ...]) -> Grads:
    logp, ref_logp = args["logp"], args["ref_logp"]
    grad = grads[0]
    if grad is None:
        grad = torch.zeros(logp.shape, dtype=compute_dtype(logp, ref_logp), device=logp.device)
    return (kernel.backward(grad.contiguous(), logp, ref_logp, args["kl_estimator"],
                            args["kl_clamp"]),)


def _output_meta(logp: Tensor, ref_logp: Tensor, kl_estimator: str,
                 kl_clamp: float | None) -> tuple[Out | None, ...]:
    return (Out(tuple(logp.shape), compute_dtype(logp, ref_logp), logp.device),)


def _grad_meta(grad_value: Tensor, logp: Tensor, *_: Any) -> tuple[Out | None, ...]:
    return (Out(tuple(logp.shape), logp.dtype, logp.device),)


# ---------------------------------------------------------------------------
# conformance samples and the spec


def _samples(device: torch.device, dtype: torch.dtype) -> Iterator[Sample]:
    gen = torch.Generator().manual_seed(2718)

    def case(name: str, shape: tuple[int, ...], estimator: str,
             clamp: float | None = None) -> Sample:
        logp = -torch.rand(shape, generator=gen, dtype=torch.float64) * 4
        ref = logp + torch.randn(shape, generator=gen, dtype=torch.float64) * 0.8
        if logp.numel() >= 3:  # far beyond any clamp, on both sides, and one identical
            ref.view(-1)[0], ref.view(-1)[1] = logp.view(-1)[0] - 30, logp.view(-1)[1] + 25
            ref.view(-1)[2] = logp.view(-1)[2]
        args = {"logp": logp.to(device, dtype), "ref_logp": ref.to(device, torch.float32),
                "kl_estimator": estimator, "kl_clamp": clamp}
        return Sample(name, args)

    for estimator in KL_ESTIMATORS:
        yield case(estimator, (5, 9), estimator)
    yield case("k3-clamped", (5, 9), "k3", 10.0)
    yield case("abs+-clamped", (4, 6), "abs+", 0.3)
    yield case("k2-flat", (17,), "k2")
    yield case("empty", (0, 4), "k3")


def _public_prepare(logp: Tensor, ref_logp: Tensor, *, options: PolicyLossOptions | None = None,
                    **settings: Any) -> dict[str, Any]:
    return _prepare(logp, ref_logp, options, settings)


def _reference(args: Mapping[str, Any]) -> tuple[Tensor, ...]:
    return (reference.token_kl(args["logp"], args["ref_logp"], args["kl_estimator"],
                               args["kl_clamp"]),)


def _grad_check(kernel: BoundKernel, args: dict[str, Any],
                gen: torch.Generator) -> Iterator[GradCase]:
    logp = args["logp"]
    dtype = compute_dtype(logp, args["ref_logp"])
    grad = torch.rand(logp.shape, generator=gen, dtype=dtype).to(logp.device)
    leaf = logp.detach().to(torch.float64).requires_grad_(True)
    value = reference.token_kl(leaf, args["ref_logp"], args["kl_estimator"], args["kl_clamp"])
    (expected,) = torch.autograd.grad(value, leaf, grad.to(torch.float64))
    expected = grad_expected(expected, logp.dtype)  # beyond float16's range: infinite
    yield "grad_logp", kernel.backward(grad, logp, args["ref_logp"], args["kl_estimator"],
                                       args["kl_clamp"]), expected


def _opcheck_case(args: dict[str, Any]) -> tuple[Any, tuple[Any, ...]]:
    leaf = args["logp"].detach().clone().requires_grad_(True)
    return torch.ops.rlk.token_kl.default, SIGNATURE.encode(dict(args, logp=leaf))


def _shape_call(shape: Any, dtype: torch.dtype) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if len(shape) != 2:
        raise ValueError(f"takes --shape B,T; got {shape}")
    logp = torch.empty(shape, dtype=dtype, device="meta")
    return (logp, logp), {}


# Values are computed in float32 from inputs that float32 holds exactly, so they sit within
# its rounding of float64 (k3 at delta = -30 is e^30 in both); gradients are written in
# logp's dtype, one rounding allowed.
_TOLERANCES = {torch.float32: Tolerance(atol=1e-6, rtol=1e-6),
               torch.bfloat16: Tolerance(atol=1e-6, rtol=1e-6),
               torch.float16: Tolerance(atol=1e-6, rtol=1e-6),
               torch.float64: Tolerance(atol=1e-12, rtol=1e-12)}
_GRAD_TOLERANCES = {torch.float32: Tolerance(atol=1e-6, rtol=1e-6),
                    torch.bfloat16: Tolerance(atol=1e-6, rtol=8e-3),
                    torch.float16: Tolerance(atol=1e-6, rtol=1e-3),
                    torch.float64: Tolerance(atol=1e-12, rtol=1e-12)}

TOKEN_KL = OpSpec(
    name="token_kl",
    main_input="logp",
    prepare=_public_prepare,
    flags=lambda args: (args["kl_estimator"], args["kl_clamp"] is not None),
    reference=_reference,
    outputs=lambda result, args: (result[0],),
    samples=_samples,
    tolerances=_TOLERANCES,
    dtypes=FLOATS,
    opcheck_case=_opcheck_case,
    grad_check=_grad_check,
    grad_tolerances=_GRAD_TOLERANCES,
    operator=Operator(SIGNATURE, returns=("Tensor",), grad_inputs=("logp",),
                      backward=_backward),
    doc="each token's KL estimate between the policy and a reference policy",
    native=NativeKernel("rlk.ops.token_kl.native:forward", "rlk.ops.token_kl.native:backward"),
    output_meta=_output_meta,
    grad_meta=_grad_meta,
    shape_call=_shape_call,
    shape_help="B,T",
)
