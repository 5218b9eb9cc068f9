"""What every linear op checks about the LM head: hidden, weight, bias, softcap, logit_scale.

The GEMM runs in one dtype. Under `torch.autocast` that is the autocast dtype, as for
`torch.nn.functional.linear` (a bfloat16 hidden state with a float32 `lm_head.weight`
runs in bfloat16); outside it, inputs of one dtype keep it and float32 mixed with one
reduced dtype runs in the reduced one (what autocast would have picked for it). The
casts happen inside the torch ops (`kernel_arguments`, then `bind_arguments` once the
kernel is chosen), so autograd keeps the caller's tensors (no reduced copy of the weight
lives from the forward to the backward) and each gradient comes back in its input's dtype.

A float32 weight (and bias) beside a reduced GEMM dtype, mixed-precision training's
master weights, reaches a kernel declaring the `float32_weight` property as it is: the
kernel runs the GEMMs in hidden's dtype and returns the weight's and bias's gradients in
float32, as TRL's fused head does, where rounding them through the reduced dtype (as torch's
autocast linear does) costs 2^-9 of each entry. Other kernels get them cast.

`logit_scale` s multiplies the raw logits u before the soft cap c (the order of TRL's
ChunkedLogProbFunction; vLLM caps first, which differs only when a model sets both, and
none does): c * tanh(s * u / c) = s * c' * tanh(u / c') with c' = c / s, so the kernels
get the cap c / s and the temperature T / s, and never see the scale.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rlk._runtime import temperature as temperatures
from rlk._runtime import validate
from rlk._runtime.contract import BoundKernel
from rlk._runtime.temperature import Temperature


@dataclass(frozen=True)
class Head:
    """The LM head's tensors in the caller's dtypes (hidden flattened to [N, H]), the dtype
    their GEMM runs in, the kernels' soft cap and temperature (`logit_scale` folded into
    both) and hidden's leading shape."""

    hidden: Tensor
    weight: Tensor
    bias: Tensor | None
    dtype: torch.dtype
    softcap: float | None
    temperature: Temperature
    lead: tuple[int, ...]


def _autocast_dtype(device: torch.device) -> torch.dtype | None:
    try:
        enabled = torch.is_autocast_enabled(device.type)
    except RuntimeError:  # a device type autocast does not know (meta)
        return None
    return torch.get_autocast_dtype(device.type) if enabled else None


def without_autocast(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """Autocast off for the kernels inside a linear op: they pick their GEMMs' dtypes
    (float32 logits) and would otherwise see them cast to the autocast dtype."""
    if _autocast_dtype(device) is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, enabled=False)


def input_dtype(hidden: Tensor, weight: Tensor, bias: Tensor | None) -> torch.dtype:
    """The dtype the LM head's GEMM runs in (see the module docstring)."""
    autocast = _autocast_dtype(hidden.device)
    if autocast is not None:
        return autocast
    given = {hidden.dtype, weight.dtype} | ({bias.dtype} if bias is not None else set())
    if len(given) == 1:
        return hidden.dtype
    reduced = given - {torch.float32}
    if len(reduced) == 1:
        return reduced.pop()
    names = ", ".join(sorted(str(d).replace("torch.", "") for d in given))
    raise TypeError(f"hidden, weight and bias mix {names}: cast them to one dtype, "
                    "or call under torch.autocast to pick the GEMM dtype")


# the kernel property: takes a float32 weight and bias beside a reduced hidden
FLOAT32_WEIGHT = "float32_weight"


def kernel_arguments(args: Mapping[str, Any]) -> dict[str, Any]:
    """A linear op's arguments as selection reads them: hidden in the GEMM dtype,
    `gemm_dtype` itself dropped, weight and bias as given (the op's
    `Operator.kernel_arguments`; `bind_arguments` finishes them for the chosen kernel)."""
    rest = {name: value for name, value in args.items() if name != "gemm_dtype"}
    return dict(rest, hidden=args["hidden"].to(args["gemm_dtype"]))


def bind_arguments(kernel: BoundKernel | None, args: Mapping[str, Any]) -> dict[str, Any]:
    """`kernel_arguments`' output as `kernel` takes it: weight and bias in hidden's dtype,
    except a float32 weight and bias beside a reduced hidden for a kernel declaring
    FLOAT32_WEIGHT (None: any kernel, so cast)."""
    dtype = args["hidden"].dtype
    weight, bias = args["weight"], args["bias"]
    keeps_float32 = (kernel is not None and FLOAT32_WEIGHT in kernel.kernel.properties
                     and weight.dtype == torch.float32
                     and (bias is None or bias.dtype == torch.float32))
    if keeps_float32:
        return dict(args)
    return dict(args, weight=weight.to(dtype), bias=None if bias is None else bias.to(dtype))


def cast_arguments(args: Mapping[str, Any]) -> dict[str, Any]:
    """A linear op's arguments as any kernel takes them (conformance samples, `prepare`)."""
    return bind_arguments(None, kernel_arguments(args))


def prepare(hidden: Tensor, weight: Tensor, bias: Tensor | None, temperature: object,
            softcap: object, logit_scale: object) -> Head:
    """Validated head tensors (in the caller's dtypes) and options; ValueError/TypeError
    naming the expected and received values otherwise."""
    validate.tensor("hidden", hidden, validate.FLOATS)
    validate.tensor("weight", weight, validate.FLOATS)
    if hidden.dim() < 1:
        raise ValueError("hidden must be [..., H]; got a 0-d tensor")
    if weight.dim() != 2 or weight.shape[0] < 1:
        raise ValueError(f"weight must be [V, H] with V >= 1; got shape {tuple(weight.shape)}")
    width = hidden.shape[-1]
    if weight.shape[1] != width:
        raise ValueError(f"weight must be [V, {width}] (H from hidden); "
                         f"got shape {tuple(weight.shape)}")
    validate.same_device("weight", weight, hidden, "hidden")
    if bias is not None:
        validate.tensor("bias", bias, validate.FLOATS)
        validate.shape("bias", bias, (weight.shape[0],), " (one per row of weight)")
        validate.same_device("bias", bias, hidden, "hidden")
    cap = None if softcap is None else validate.positive_scalar("softcap", softcap)
    scale = validate.positive_scalar("logit_scale", logit_scale)
    dtype = input_dtype(hidden, weight, bias)
    lead = tuple(hidden.shape[:-1])
    temp = temperatures.prepare(temperature, lead, hidden, "hidden")
    rows = 1
    for size in lead:
        rows *= size
    return Head(
        hidden=hidden.reshape(rows, width),
        weight=weight,
        bias=bias,
        dtype=dtype,
        softcap=None if cap is None else cap / scale,
        temperature=temp if scale == 1.0 else temp / scale,
        lead=lead,
    )
