"""`linear_policy_loss`: hidden states to the policy loss, the LM head's logits never held.

An op that computes the loss itself knows d loss / d logp of every token as soon as that
token's log-probability exists, so each row chunk's logits are computed once and feed the
two gradient GEMMs directly: three GEMMs where `linear_logp` + `policy_loss` need four.
The forward therefore returns the gradients of the loss too; the backward only scales them
by the upstream gradient. Every `policy_loss` option is accepted and validated by
`policy_loss` itself (one source for each option and its default).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from rlk._runtime import head, kernel_checks, shards, validate
from rlk._runtime.contract import BoundKernel, Out, attribute
from rlk._runtime.operator import Grads, Operator
from rlk._runtime.signature import (
    KernelArgs,
    Signature,
    flags_param,
    group_param,
    nested_param,
    plain,
    temperature_param,
)
from rlk._runtime.spec import GradCase, NativeKernel, OpSpec, Sample, Tolerance
from rlk._runtime.temperature import Temperature
from rlk.ops.linear_logp import reference
from rlk.ops.linear_policy_loss import reference as linear_policy_loss_reference
from rlk.ops.policy_loss import op as policy_losses
from rlk.ops.policy_loss.options import METRICS

ENTROPY_METRIC = "entropy"


METRIC_NAMES = (*METRICS, ENTROPY_METRIC)  # the metrics vector: policy_loss's, the entropy
POLICY_TENSORS = policy_losses.TENSORS[1:]  # policy_loss's tensor arguments after logp


# ---------------------------------------------------------------------------
# argument checking: public arguments -> kernel-level arguments


def _policy(old_logp: Tensor, advantages: Tensor, mask: Tensor, tokens: Tensor,
            ignore_index: int, options: Mapping[str, Any]) -> dict[str, Any]:
    """policy_loss's kernel arguments for a [B, T] logp, minus logp itself (policy_loss
    validates them); positions whose token is ignore_index count as masked."""
    placeholder = torch.zeros((), dtype=torch.float32, device=old_logp.device).expand(
        old_logp.shape)
    args = policy_losses.POLICY_LOSS.prepare(placeholder, old_logp, advantages, mask, **options)
    del args["logp"]
    args["mask"] = (args["mask"] != 0) & (tokens.view(old_logp.shape) != ignore_index)
    return args


def _check_layout(lead: tuple[int, ...], tokens: Tensor, old_logp: Tensor) -> None:
    """hidden [B, T, H] or [B * T, H]; tokens [B, T] or hidden's leading shape."""
    validate.tensor("old_logp", old_logp, (*validate.FLOATS, torch.float64))
    if old_logp.dim() != 2:
        raise ValueError(f"old_logp must be [B, T] (one per token of each sequence); "
                         f"got shape {tuple(old_logp.shape)}")
    rows = old_logp.numel()
    if lead not in (tuple(old_logp.shape), (rows,)):
        raise ValueError(f"hidden must be [B, T, H] = {(*old_logp.shape, 'H')} or "
                         f"[B * T, H] = {(rows, 'H')} (B, T from old_logp); "
                         f"got leading shape {lead}")
    if tuple(tokens.shape) not in (tuple(old_logp.shape), lead):
        raise ValueError(f"tokens must have shape {tuple(old_logp.shape)} (that of old_logp) "
                         f"or {lead} (hidden's leading shape); got {tuple(tokens.shape)}")


def _prepare(hidden: Tensor, weight: Tensor, tokens: Tensor, old_logp: Tensor,
             advantages: Tensor, mask: Tensor, bias: Tensor | None, temperature: Temperature,
             ignore_index: int, group: Any, entropy_coef: float, softcap: float | None,
             logit_scale: float, options: Mapping[str, Any]) -> dict[str, Any]:
    """Validate public arguments; return the op's arguments: the kernel's, with hidden, weight
    and bias in the caller's dtypes and their GEMM's as gemm_dtype (needs_input_grad left
    to the caller)."""
    validate.tensor("tokens", tokens, validate.INDICES)
    prepared = head.prepare(hidden, weight, bias, temperature, softcap, logit_scale)
    _check_layout(prepared.lead, tokens, old_logp)
    validate.same_device("tokens", tokens, hidden, "hidden")
    validate.same_device("old_logp", old_logp, hidden, "hidden")
    validate.integer("ignore_index", ignore_index)
    coef = validate.positive_scalar("entropy_coef", entropy_coef, allow_zero=True)
    shards.group_name(group)
    flat = tokens.reshape(-1).to(torch.int64)
    policy = _policy(old_logp, advantages, mask, flat, ignore_index, options)
    # masked positions are ignored rows: logp 0, no gradient, garbage tokens harmless
    kernel_tokens = torch.where(policy["mask"].reshape(-1), flat, ignore_index)
    if validate.value_checks(kernel_tokens):
        total = weight.shape[0]
        if group is not None:
            total = shards.layout(weight.shape[0], group, weight.device).total
        shards.check_tokens(kernel_tokens, total, ignore_index)
    return {
        "hidden": prepared.hidden,
        "weight": prepared.weight,
        "tokens": kernel_tokens,
        "bias": prepared.bias,
        "temperature": prepared.temperature,
        "ignore_index": ignore_index,
        "group": group,
        "softcap": prepared.softcap,
        "entropy_coef": coef,
        "policy": policy,
        "needs_input_grad": (False, False, False),
        "gemm_dtype": prepared.dtype,
    }


def _flags(args: Mapping[str, Any]) -> tuple[Any, ...]:
    return (
        args["bias"] is not None,
        args["group"] is not None,
        isinstance(args["temperature"], Tensor),
        args["softcap"] is not None,
        _policy_flags(args["policy"]),
        args["needs_input_grad"],
        args["weight"].dtype != args["hidden"].dtype,  # a float32 weight some checks decline
    )


def _policy_flags(policy: Mapping[str, Any]) -> tuple[Any, ...]:
    """policy_loss's own cache-key flags for these policy arguments."""
    placeholder = policy["old_logp"]
    return policy_losses.POLICY_LOSS.flags(dict(policy, logp=placeholder))


# ---------------------------------------------------------------------------
# the torch operator: policy_loss's own parameters after logp travel through it unchanged

SIGNATURE = Signature((
    plain("hidden", "Tensor"), plain("weight", "Tensor"), plain("tokens", "Tensor"),
    plain("bias", "Tensor?"), temperature_param(), plain("ignore_index", "int"), group_param(),
    plain("softcap", "float?"), plain("entropy_coef", "float"),
    flags_param("needs_input_grad", ("need_hidden", "need_weight", "need_bias")),
    plain("gemm_dtype", "ScalarType"), nested_param("policy", policy_losses.SIGNATURE.params[1:]),
))


def _forward_with_grads(kernel: BoundKernel,
                        args: KernelArgs) -> tuple[tuple[Tensor, ...], list[Any]]:
    """(loss, metrics, logp) and the gradients the kernel computed with them, kept private
    to the call: the backward scales them in place, so no second copy of the weight's
    gradient ever exists."""
    loss, metrics, logp, *grads = kernel.forward(**args)
    return (loss, metrics, logp), [kernel, grads, args["needs_input_grad"]]


def _scaled_grads(state: list[Any], grads: Grads) -> Grads:
    """The forward's gradients times the upstream gradient of the loss, in place (once: a
    second backward of the same call raises)."""
    kernel, saved, needs = state
    if saved is None:
        raise RuntimeError("rlk.linear_policy_loss computes its gradients in the forward "
                           "and scales them in place, so a call's backward runs once; "
                           "call the op again to differentiate again")
    state[1] = None
    grad_loss = grads[0]
    if grad_loss is None:
        return (None,) * len(saved)
    wanted = [grad if need else None for grad, need in zip(saved, needs, strict=True)]
    _scale(kernel, [grad for grad in wanted if grad is not None], grad_loss)
    return tuple(wanted)


def _scale(kernel: BoundKernel, grads: list[Tensor], grad_loss: Tensor) -> None:
    """grads *= grad_loss in place, by the kernel's `forward.scale_grads` when it has one
    (torch's mul_ by a 0-d device tensor takes a slow strided path)."""
    scale_grads = getattr(kernel.kernel.forward, "scale_grads", None)
    if scale_grads is None:
        for grad in grads:
            grad.mul_(grad_loss)
        return
    try:
        scale_grads(grads, grad_loss)
    except Exception as exc:
        attribute(exc, kernel.kernel, "forward.scale_grads")
        raise


# ---------------------------------------------------------------------------
# the public function


def _needs_grad(*tensors: Tensor | None) -> tuple[bool, bool, bool]:
    enabled = torch.is_grad_enabled()
    return tuple(enabled and t is not None and t.requires_grad  # type: ignore[return-value]
                 for t in tensors)


def linear_policy_loss(
    hidden: Tensor,
    weight: Tensor,
    tokens: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    bias: Tensor | None = None,
    temperature: Temperature = 1.0,
    ignore_index: int = -100,
    group: Any = None,
    entropy_coef: float = 0.0,
    softcap: float | None = None,
    logit_scale: float = 1.0,
    **options: Any,
) -> tuple[Tensor, dict[str, Tensor]]:
    """`policy_loss(linear_logp(hidden, weight, tokens), old_logp, advantages, mask, ...)`
    minus `entropy_coef` times the entropy aggregated as the loss is, without the logits.

    hidden `[B, T, H]` or `[B * T, H]`; tokens `[B, T]` (or hidden's leading shape);
    old_logp, mask `[B, T]`; advantages as `policy_loss` takes them; every other keyword is
    a `policy_loss` option (ref_logp, clip_low, kl_coef, ratio_level, agg, ...). bias,
    temperature, ignore_index, group, softcap and logit_scale are `linear_logp`'s. Positions
    whose token is ignore_index count as masked; masked positions give logp 0 and no
    gradient. Returns the loss (0-d float32, differentiable w.r.t. hidden, weight, bias) and
    detached metrics: policy_loss's, "entropy" (the masked mean) and "logp" `[B, T]`.
    """
    args = _prepare(hidden, weight, tokens, old_logp, advantages, mask, bias, temperature,
                    ignore_index, group, entropy_coef, softcap, logit_scale, options)
    args["needs_input_grad"] = _needs_grad(args["hidden"], args["weight"], args["bias"])
    loss, metrics, logp = LINEAR_POLICY_LOSS.call(args)
    values = metrics.detach()
    found = {name: values[index] for index, name in enumerate(METRIC_NAMES)}
    found["logp"] = logp.detach().view(old_logp.shape)
    return loss, found


# ---------------------------------------------------------------------------
# conformance samples and the spec


def _samples(device: torch.device, dtype: torch.dtype) -> Iterator[Sample]:
    gen = torch.Generator().manual_seed(1616)

    def randn(*size: int, scale: float = 1.0) -> Tensor:
        return (torch.randn(*size, generator=gen) * scale).to(device)

    def case(name: str, batch: int = 3, length: int = 5, width: int = 8, vocab: int = 23,
             bias: bool = False, per_token: bool = False, ref: bool = False,
             rollout: bool = False, **extra: Any) -> Sample:
        options = {k: extra.pop(k) for k in list(extra) if k not in ("temperature", "softcap",
                                                                   "entropy_coef")}
        hidden = randn(batch * length, width).to(dtype)
        weight = randn(vocab, width, scale=2.0 / width**0.5).to(dtype)
        tokens = torch.randint(0, vocab, (batch, length), generator=gen).to(device)
        logp = reference.linear_logp_entropy(hidden, weight, tokens.reshape(-1))[0]
        old = (logp.view(batch, length) + randn(batch, length, scale=0.2)).float()
        mask = (torch.rand(batch, length, generator=gen) > 0.2).float().to(device)
        if batch:
            mask[0] = 1.0
        if ref:
            options["ref_logp"] = old + randn(batch, length, scale=0.3)
        if rollout:
            options["rollout_logp"] = old + randn(batch, length, scale=0.3)
        adv = randn(*((batch, length) if per_token else (batch,)))
        args = _prepare(hidden, weight, tokens, old, adv, mask,
                        randn(vocab).to(dtype) if bias else None, extra.get("temperature", 1.0),
                        -100, None, extra.get("entropy_coef", 0.0), extra.get("softcap"), 1.0,
                        options)
        args["needs_input_grad"] = (True, True, bias)
        return Sample(name, head.cast_arguments(args))

    yield case("ppo")
    yield case("kl-k3-seq-mean", ref=True, kl_coef=0.1, agg="seq-mean-token-mean")
    yield case("gspo", ratio_level="sequence", clip_low=0.03, clip_high=0.04,
               agg="seq-mean-token-mean")
    yield case("tis", rollout=True, tis_cap=1.5, agg="seq-mean-token-sum")
    yield case("dual-clip-per-token", per_token=True, dual_clip=2.0, clip_low=0.1)
    yield case("entropy-bonus", entropy_coef=0.05, ref=True, kl_coef=0.02)
    yield case("cispo-k3+", objective="cispo", clip_high=4.0, ref=True, kl_coef=0.05,
               kl_estimator="k3+")
    yield case("vespo", objective="vespo", rollout=True, agg="seq-mean-token-mean")
    yield case("importance-weights", importance_weights=randn(3).abs() + 0.5, divisor=9.0)
    yield case("bias-temperature", bias=True, temperature=0.7, vocab=40)
    yield case("softcap", softcap=1.5, entropy_coef=0.01, ref=True, kl_coef=0.05, width=16)
    sample = case("per-row-temperature", length=4)
    sample.args["temperature"] = torch.rand(12, generator=gen).to(device) + 0.5
    yield sample
    sample = case("masked-garbage", ref=True, kl_coef=0.1)
    # a masked position may hold any token, an ignored one a NaN hidden state
    sample.args["tokens"][[3, 7]] = -100
    sample.args["hidden"][7] = float("nan")
    sample.args["policy"]["mask"][0, 3] = sample.args["policy"]["mask"][1, 2] = False
    yield sample
    yield case("one-token-sequences", batch=4, length=1, agg="seq-mean-token-mean")
    yield case("empty", batch=0, length=5)


def _public_prepare(hidden: Tensor, weight: Tensor, tokens: Tensor, old_logp: Tensor,
                    advantages: Tensor, mask: Tensor, *, bias: Tensor | None = None,
                    temperature: Temperature = 1.0, ignore_index: int = -100,
                    group: Any = None, entropy_coef: float = 0.0,
                    softcap: float | None = None, logit_scale: float = 1.0,
                    **options: Any) -> dict[str, Any]:
    args = _prepare(hidden, weight, tokens, old_logp, advantages, mask, bias, temperature,
                    ignore_index, group, entropy_coef, softcap, logit_scale, options)
    args["needs_input_grad"] = _needs_grad(args["hidden"], args["weight"], args["bias"])
    return head.kernel_arguments(args)  # as the op's run selects on them


def _reference_loss(args: Mapping[str, Any], hidden: Any, weight: Any,
                    bias: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    policy = args["policy"]
    return linear_policy_loss_reference.linear_policy_loss(
        hidden, weight, args["tokens"], bias=bias, temperature=args["temperature"],
        ignore_index=args["ignore_index"], softcap=args["softcap"],
        entropy_coef=args["entropy_coef"], **policy)


def _reference(args: Mapping[str, Any]) -> tuple[Tensor, ...]:
    return _reference_loss(args, args["hidden"], args["weight"], args["bias"])


def _outputs(result: Any, args: Mapping[str, Any]) -> tuple[Tensor, ...]:
    return tuple(result[:3])


def _grad_check(kernel: BoundKernel, args: dict[str, Any],
                gen: torch.Generator) -> Iterator[GradCase]:
    """The gradients the kernel's forward returns against float64 autograd of the loss.

    Ignored rows contribute nothing (their hidden state may be NaN): the reference sees
    them as zeros, which float64 autograd differentiates to the same zero contribution.
    """
    ignored = (args["tokens"] == args["ignore_index"]).unsqueeze(1)
    hidden = args["hidden"].masked_fill(ignored, 0.0)
    leaves = [None if t is None else t.detach().to(torch.float64).requires_grad_(True)
              for t in (hidden, args["weight"], args["bias"])]
    loss = _reference_loss(args, *leaves)[0]
    inputs = [leaf for leaf in leaves if leaf is not None]
    expected = torch.autograd.grad(loss, inputs, allow_unused=True)
    found = kernel.forward(**dict(args, needs_input_grad=(True, True, args["bias"] is not None)))
    names = ("grad_hidden", "grad_weight", "grad_bias")
    for name, actual, want, leaf in zip(names, found[3:], expected, inputs, strict=False):
        yield name, actual, torch.zeros_like(leaf) if want is None else want


def _opcheck_case(args: dict[str, Any]) -> tuple[Any, tuple[Any, ...]]:
    def leaf(value: Tensor | None) -> Tensor | None:
        return None if value is None else value.detach().clone().requires_grad_(True)

    call = dict(args, hidden=leaf(args["hidden"]), weight=leaf(args["weight"]),
                bias=leaf(args["bias"]), gemm_dtype=args["hidden"].dtype)
    return torch.ops.rlk.linear_policy_loss.default, SIGNATURE.encode(call)


def _output_meta(hidden: Tensor, weight: Tensor, tokens: Tensor, bias: Tensor | None,
                 needs_input_grad: tuple[bool, bool, bool], **_: Any) -> tuple[Out | None, ...]:
    """(loss, metrics, logp) in float32, then each gradient asked for in float32 or its
    input's dtype (an empty tensor of hidden's dtype for one not asked for)."""
    device = hidden.device
    empty = Out((0,), hidden.dtype, device)
    grads = tuple(Out(tuple(value.shape), value.dtype, device, (torch.float32,))
                  if need and value is not None
                  else empty
                  for value, need in zip((hidden, weight, bias), needs_input_grad, strict=True))
    return (Out((), torch.float32, device), Out((len(METRIC_NAMES),), torch.float32, device),
            Out((hidden.shape[0],), torch.float32, device), *grads)


def _shape_call(shape: Any, dtype: torch.dtype) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if len(shape) != 4:
        raise ValueError(f"takes --shape B,T,H,V; got {shape}")
    b, t, h, v = shape
    hidden = torch.empty(b, t, h, dtype=dtype, device="meta")
    weight = torch.empty(v, h, dtype=dtype, device="meta")
    logp = torch.empty(b, t, device="meta")
    return (hidden, weight, torch.empty(b, t, dtype=torch.int64, device="meta"), logp,
            torch.empty(b, device="meta"), logp), {}


# The logits are float32 whatever the inputs' dtype: the loss and logp are as close to float64
# as policy_loss on exact log-probabilities; the logits gradient is rounded to the inputs'
# dtype once before the GEMMs (a kernel may write the results in float32 or that dtype).
_TOLERANCES = {dtype: Tolerance(atol=2e-5, rtol=1e-5) for dtype in validate.FLOATS}
_GRAD_TOLERANCES = {
    torch.float32: Tolerance(atol=1e-5, rtol=1e-4),
    torch.bfloat16: Tolerance(atol=2e-3, rtol=3e-2),
    torch.float16: Tolerance(atol=3e-4, rtol=5e-3),
}

LINEAR_POLICY_LOSS = OpSpec(
    name="linear_policy_loss",
    main_input="hidden",
    prepare=_public_prepare,
    flags=_flags,
    reference=_reference,
    outputs=_outputs,
    samples=_samples,
    tolerances=_TOLERANCES,
    dtypes=validate.FLOATS,
    opcheck_case=_opcheck_case,
    grad_check=_grad_check,
    grad_tolerances=_GRAD_TOLERANCES,
    operator=Operator(SIGNATURE, returns=("Tensor",) * 6, grad_inputs=("hidden", "weight", "bias"),
                      detached_outputs=(1, 2), grad_outputs=(3, 4, 5),
                      forward_with_grads=_forward_with_grads, backward_from=_scaled_grads,
                      kernel_arguments=head.kernel_arguments,
                      bind_arguments=head.bind_arguments, without_autocast=True),
    doc="policy_loss of linear_logp's log-probabilities (and an entropy bonus) in three GEMMs",
    native=NativeKernel("rlk.ops.linear_policy_loss.native:forward", uses=("logp_entropy",)),
    output_meta=_output_meta,
    shape_call=_shape_call,
    shape_help="B,T,H,V",
    nan_rule=kernel_checks.finite_inputs_rule,
)
