"""`linear_logp` and `linear_logp_entropy`: logp of `hidden @ weight.T + bias` without the logits.

The LM head and the log-softmax fused: backends never hold the `[N, V]` logits at
once, so the extra memory is O(N) plus one chunk, whatever the vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from rlk._runtime import head, kernel_checks, shards, validate
from rlk._runtime.contract import BoundKernel, Out
from rlk._runtime.operator import Grads, Operator
from rlk._runtime.signature import Signature, group_param, plain, temperature_param
from rlk._runtime.spec import GradCase, NativeKernel, OpSpec, Sample, Tolerance
from rlk._runtime.temperature import Temperature
from rlk.ops.linear_logp import reference

# ---------------------------------------------------------------------------
# argument checking: public arguments -> kernel-level arguments


def _prepare(hidden: Tensor, weight: Tensor, tokens: Tensor, bias: Tensor | None,
             temperature: Temperature, ignore_index: int, group: Any, softcap: float | None,
             logit_scale: float) -> tuple[dict[str, Any], tuple[int, ...]]:
    """Validate public arguments; return flattened kernel arguments and the output shape."""
    validate.tensor("tokens", tokens, validate.INDICES)
    prepared = head.prepare(hidden, weight, bias, temperature, softcap, logit_scale)
    validate.shape("tokens", tokens, prepared.lead, " (the leading dimensions of hidden)")
    validate.same_device("tokens", tokens, hidden, "hidden")
    validate.integer("ignore_index", ignore_index)
    shards.group_name(group)
    flat_tokens = tokens.reshape(-1).to(torch.int64)
    if validate.value_checks(flat_tokens):
        _check_ranges(flat_tokens, weight, ignore_index, group)
    args = {
        "hidden": prepared.hidden,
        "weight": prepared.weight,
        "tokens": flat_tokens,
        "bias": prepared.bias,
        "temperature": prepared.temperature,
        "ignore_index": ignore_index,
        "group": group,
        "softcap": prepared.softcap,
        "gemm_dtype": prepared.dtype,
    }
    return args, prepared.lead


def _check_ranges(tokens: Tensor, weight: Tensor, ignore_index: int, group: Any) -> None:
    """The opt-in checks that need a device sync (RLK_CHECK_INPUTS=1)."""
    total = weight.shape[0]
    if group is not None:
        total = shards.layout(weight.shape[0], group, weight.device).total
    shards.check_tokens(tokens, total, ignore_index)


def _flags(args: Mapping[str, Any]) -> tuple[Any, ...]:
    return (
        args.get("with_entropy", False),
        args.get("bias") is not None,
        args.get("group") is not None,
        isinstance(args["temperature"], Tensor),
        args.get("softcap") is not None,
        args["weight"].dtype != args["hidden"].dtype,  # a float32 weight some checks decline
    )


# ---------------------------------------------------------------------------
# torch operators: what torch.compile and autograd see

_LSE = torch.float64  # the saved log-sum-exp, as the logp kernels write and read it


def _signature(with_entropy: bool) -> Signature:
    return Signature((plain("hidden", "Tensor"), plain("weight", "Tensor"),
                      plain("tokens", "Tensor"), plain("bias", "Tensor?"), temperature_param(),
                      plain("ignore_index", "int"), group_param(), plain("softcap", "float?"),
                      plain("gemm_dtype", "ScalarType")),
                     fixed={"with_entropy": with_entropy})


def _backward(kernel: BoundKernel, args: Mapping[str, Any], grads: Grads,
              needs: tuple[bool, ...]) -> Grads:
    """Gradients to (hidden, weight, bias) from the kernel's backward (None where not
    needed); an output without a gradient counts as zeros."""
    grad_logp, grad_entropy = grads[0], grads[1]
    entropy = args["entropy"]
    if grad_logp is None or (grad_entropy is None and entropy is not None):
        zeros = args["hidden"].new_zeros(args["hidden"].shape[0], dtype=torch.float32)
        grad_logp = zeros if grad_logp is None else grad_logp
        grad_entropy = zeros if grad_entropy is None and entropy is not None else grad_entropy
    bias = args["bias"]
    return tuple(kernel.backward(
        grad_logp.contiguous(), None if grad_entropy is None else grad_entropy.contiguous(),
        args["hidden"], args["weight"], args["tokens"], bias, args["temperature"],
        args["ignore_index"], args["group"], args["lse"], entropy,
        (needs[0], needs[1], needs[2] and bias is not None), args["softcap"],
    ))


def _operator(with_entropy: bool) -> Operator:
    return Operator(_signature(with_entropy),
                    returns=("Tensor", "Tensor" if with_entropy else None, "Tensor"),
                    grad_inputs=("hidden", "weight", "bias"), backward=_backward,
                    detached_outputs=(2,), saved_outputs=((1, "entropy"), (2, "lse")),
                    kernel_arguments=head.kernel_arguments,
                    bind_arguments=head.bind_arguments, without_autocast=True)


# ---------------------------------------------------------------------------
# public functions


def linear_logp(
    hidden: Tensor,
    weight: Tensor,
    tokens: Tensor,
    *,
    bias: Tensor | None = None,
    temperature: Temperature = 1.0,
    ignore_index: int = -100,
    group: Any = None,
    softcap: float | None = None,
    logit_scale: float = 1.0,
) -> Tensor:
    """`logp(hidden @ weight.T + bias, tokens)` without materialising the `[N, V]` logits.

    hidden `[..., H]`, weight `[V, H]` and bias `[V]` are floating tensors; the GEMM runs
    in one dtype (torch.autocast's, else theirs; float32 mixed with a reduced dtype runs
    in the reduced one) and writes float32 logits. `softcap` caps them to
    softcap * tanh(logits / softcap) (Gemma), then `logit_scale` multiplies them, then the
    temperature divides them. tokens `[...]`. Differentiable w.r.t. hidden, weight and
    bias. With `group`, `weight` (and `bias`) hold this rank's contiguous slice of the
    vocabulary (rank order) and tokens are global ids: the result equals the unsharded op.
    """
    args, shape = _prepare(hidden, weight, tokens, bias, temperature, ignore_index, group,
                           softcap, logit_scale)
    result = LINEAR_LOGP.call(dict(args, with_entropy=False))[0]
    return result.view(shape)


def linear_logp_entropy(
    hidden: Tensor,
    weight: Tensor,
    tokens: Tensor,
    *,
    bias: Tensor | None = None,
    temperature: Temperature = 1.0,
    ignore_index: int = -100,
    group: Any = None,
    softcap: float | None = None,
    logit_scale: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """`linear_logp` plus the entropy of softmax(logits / T), both differentiable."""
    args, shape = _prepare(hidden, weight, tokens, bias, temperature, ignore_index, group,
                           softcap, logit_scale)
    result, entropy, _ = LINEAR_LOGP_ENTROPY.call(dict(args, with_entropy=True))
    return result.view(shape), entropy.view(shape)


# ---------------------------------------------------------------------------
# conformance samples and the specs


def _samples(with_entropy: bool):
    def samples(device: torch.device, dtype: torch.dtype) -> Iterator[Sample]:
        gen = torch.Generator().manual_seed(4321)

        def randn(*size: int, scale: float = 1.0) -> Tensor:
            values = torch.randn(*size, generator=gen) * scale
            return values.to(device=device, dtype=dtype)

        def case(name: str, rows: int, width: int, vocab: int, check_backward: bool = True,
                 bias: bool = False, **extra: Any) -> Sample:
            args = {
                "hidden": randn(rows, width),
                "weight": randn(vocab, width, scale=2.0 / width**0.5),
                "tokens": torch.randint(0, vocab, (rows,), generator=gen).to(device),
                "bias": randn(vocab) if bias else None,
                "temperature": 1.0,
                "ignore_index": -100,
                "with_entropy": with_entropy,
                "group": None,
                "softcap": None,
            }
            args.update(extra)
            return Sample(name, args, check_backward)

        yield case("small", 5, 8, 11)
        yield case("bias", 6, 16, 37, bias=True)
        yield case("vocab-one", 3, 4, 1, bias=True)
        yield case("wide", 9, 24, 1500)
        yield case("temperature", 6, 8, 40, temperature=0.6)
        sample = case("per-row-temperature", 6, 8, 33, bias=True)
        sample.args["temperature"] = torch.rand(6, generator=gen).to(device) * 1.5 + 0.25
        yield sample
        sample = case("ignore-index", 8, 8, 20)
        sample.args["tokens"][[0, 6]] = -100
        yield sample
        sample = case("ignore-index-custom", 5, 8, 20, ignore_index=4)
        sample.args["tokens"][3] = 4
        yield sample
        sample = case("out-of-range", 5, 8, 20, check_backward=False)
        sample.args["tokens"][[1, 3]] = torch.tensor([20, -3], device=device)
        yield sample
        sample = case("nan-row", 4, 8, 20, check_backward=False)
        sample.args["hidden"][2, 5] = float("nan")
        yield sample
        sample = case("partial-neg-inf", 5, 8, 20, bias=True)
        sample.args["bias"][:7] = float("-inf")
        sample.args["tokens"] = torch.randint(7, 20, (5,), generator=gen).to(device)
        yield sample
        sample = case("non-contiguous", 6, 8, 30)
        sample.args["hidden"] = randn(8, 6).t()
        sample.args["weight"] = randn(30, 16, scale=0.5)[:, ::2]
        yield sample
        yield case("softcap", 6, 16, 45, bias=True, softcap=1.5, temperature=0.7)
        sample = case("softcap-saturated", 5, 16, 60, softcap=2.0)
        sample.args["hidden"] = randn(5, 16, scale=12.0)  # |logits| >> softcap: tanh saturates
        yield sample
        sample = case("softcap-per-row-temperature", 6, 8, 33, softcap=3.0)
        sample.args["temperature"] = torch.rand(6, generator=gen).to(device) + 0.5
        sample.args["tokens"][2] = -100
        yield sample
        sample = case("large-logits", 6, 32, 500, temperature=0.7)
        sample.args["hidden"] = randn(6, 32, scale=8.0)  # logits ~ 45: exact float32 needed
        yield sample
        yield case("empty", 0, 8, 12)

    return samples


def _public_prepare(with_entropy: bool):
    def prepare(hidden: Tensor, weight: Tensor, tokens: Tensor, *, bias: Tensor | None = None,
                temperature: Temperature = 1.0, ignore_index: int = -100, group: Any = None,
                softcap: float | None = None, logit_scale: float = 1.0) -> dict[str, Any]:
        args, _ = _prepare(hidden, weight, tokens, bias, temperature, ignore_index, group,
                           softcap, logit_scale)
        args = head.kernel_arguments(args)  # as the op's run selects on them
        args["with_entropy"] = with_entropy
        return args

    return prepare


def _reference(args: Mapping[str, Any]) -> tuple[Tensor, ...]:
    logp, entropy = reference.linear_logp_entropy(
        args["hidden"], args["weight"], args["tokens"], bias=args["bias"],
        temperature=args["temperature"], ignore_index=args["ignore_index"],
        softcap=args["softcap"],
    )
    return (logp, entropy) if args["with_entropy"] else (logp,)


def _outputs(result: Any, args: Mapping[str, Any]) -> tuple[Tensor, ...]:
    logp, entropy, _ = result
    return (logp, entropy) if args["with_entropy"] else (logp,)


def _grad_check(kernel: BoundKernel, args: dict[str, Any],
                gen: torch.Generator) -> Iterator[GradCase]:
    """The kernel's backward to hidden, weight and bias against float64 autograd."""
    rows = args["hidden"].shape[0]
    device = args["hidden"].device
    grad_logp = torch.randn(rows, generator=gen).to(device)
    grad_entropy = torch.randn(rows, generator=gen).to(device) if args["with_entropy"] else None
    _, entropy, lse = kernel.forward(**args)
    expected = reference.linear_logp_entropy_grad(
        args["hidden"], args["weight"], args["tokens"], grad_logp, grad_entropy,
        bias=args["bias"], temperature=args["temperature"], ignore_index=args["ignore_index"],
        softcap=args["softcap"],
    )
    got = kernel.backward(grad_logp, grad_entropy, args["hidden"], args["weight"],
                          args["tokens"], args["bias"], args["temperature"],
                          args["ignore_index"], None, lse, entropy,
                          (True, True, args["bias"] is not None), args["softcap"])
    names = ("grad_hidden", "grad_weight", "grad_bias")
    for name, actual, want in zip(names, got, expected, strict=True):
        if want is not None:
            assert actual is not None, f"{name} was asked for but not returned"
            yield name, actual, want


def _opcheck_case(args: dict[str, Any]) -> tuple[Any, tuple[Any, ...]]:
    def leaf(value: Tensor | None) -> Tensor | None:
        return None if value is None else value.detach().clone().requires_grad_(True)

    op = (torch.ops.rlk.linear_logp_entropy.default if args["with_entropy"]
          else torch.ops.rlk.linear_logp.default)
    leaves = {name: leaf(args[name]) for name in ("hidden", "weight", "bias")}
    return op, _signature(args["with_entropy"]).encode(
        dict(args, **leaves, gemm_dtype=args["hidden"].dtype))


def _batch_slice(args: dict[str, Any], start: int, stop: int) -> dict[str, Any] | None:
    if args["group"] is not None:
        return None
    temperature = args["temperature"]
    if isinstance(temperature, Tensor):
        temperature = temperature[start:stop]
    return dict(args, hidden=args["hidden"][start:stop], tokens=args["tokens"][start:stop],
                temperature=temperature)


def _output_meta(hidden: Tensor, weight: Tensor, tokens: Tensor, bias: Tensor | None,
                 temperature: Temperature, ignore_index: int, with_entropy: bool, group: Any,
                 softcap: float | None, **_: Any) -> tuple[Out | None, ...]:
    """logp (and entropy) float32, lse float64, one per row (also from the operator's
    arguments, whose gemm_dtype the kernels never see)."""
    row = Out((hidden.shape[0],), torch.float32, hidden.device)
    return row, (row if with_entropy else None), Out((hidden.shape[0],), _LSE, hidden.device)


def _grad_meta(grad_logp: Tensor, grad_entropy: Tensor | None, hidden: Tensor, weight: Tensor,
               tokens: Tensor, bias: Tensor | None, temperature: Temperature, ignore_index: int,
               group: Any, lse: Tensor, entropy: Tensor | None,
               needs_input_grad: tuple[bool, bool, bool], *_: Any) -> tuple[Out | None, ...]:
    inputs = (hidden, weight, bias)
    return tuple(
        Out(tuple(value.shape), value.dtype, value.device, (torch.float32,))
        if need and value is not None else None
        for value, need in zip(inputs, needs_input_grad, strict=True)
    )


def _nan_rule(named: Mapping[str, Any], outputs: tuple[Any, ...]) -> tuple[Tensor | bool, ...]:
    hidden, weight, bias, tokens = named["hidden"], named["weight"], named["bias"], named["tokens"]
    if named["group"] is not None or not kernel_checks.finite(weight, bias):
        return True, True, True
    fine = kernel_checks.fine_rows(hidden, named["temperature"])
    ignored = tokens == named["ignore_index"]
    token_fine = ((tokens >= 0) & (tokens < weight.shape[0])) | ignored
    return ~(fine & token_fine), ~fine, ~fine | ignored


def _shape_call(shape: Any, dtype: torch.dtype) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if len(shape) != 3:
        raise ValueError(f"takes --shape N,H,V; got {shape}")
    n, h, v = shape
    hidden = torch.empty(n, h, dtype=dtype, device="meta")
    weight = torch.empty(v, h, dtype=dtype, device="meta")
    return (hidden, weight, torch.empty(n, dtype=torch.int64, device="meta")), {}


# Logits are float32 whatever the inputs' dtype (products of bf16/fp16 values are exact in
# float32): only float32 accumulation separates a kernel from the float64 reference.
_TOLERANCES = {dtype: Tolerance(atol=2e-5, rtol=1e-5) for dtype in validate.FLOATS}
# The logits gradient is rounded to the inputs' dtype before the two matrix products (a
# kernel may write the gradients in float32 or in the inputs' dtype).
_GRAD_TOLERANCES = {
    torch.float32: Tolerance(atol=1e-5, rtol=1e-5),
    torch.bfloat16: Tolerance(atol=4e-2, rtol=3e-2),
    torch.float16: Tolerance(atol=5e-3, rtol=5e-3),
}


def _spec(name: str, with_entropy: bool, doc: str) -> OpSpec:
    return OpSpec(
        name=name,
        main_input="hidden",
        prepare=_public_prepare(with_entropy),
        flags=_flags,
        reference=_reference,
        outputs=_outputs,
        samples=_samples(with_entropy),
        tolerances=_TOLERANCES,
        dtypes=validate.FLOATS,
        opcheck_case=_opcheck_case,
        grad_check=_grad_check,
        grad_tolerances=_GRAD_TOLERANCES,
        batch_slice=_batch_slice,
        operator=_operator(with_entropy),
        doc=doc,
        native=NativeKernel("rlk.ops.linear_logp.native:forward",
                            "rlk.ops.linear_logp.native:backward",
                            uses=("logp_entropy" if with_entropy else "logp",)),
        output_meta=_output_meta,
        grad_meta=_grad_meta,
        shape_call=_shape_call,
        shape_help="N,H,V",
        nan_rule=_nan_rule,
    )


LINEAR_LOGP = _spec("linear_logp", False, "logp of hidden @ weight.T + bias, chunked")
LINEAR_LOGP_ENTROPY = _spec("linear_logp_entropy", True,
                            "linear_logp plus the entropy, chunked")
