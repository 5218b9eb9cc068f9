"""`entropy`: the entropy of softmax(logits / T) per row, without any token."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from rlk._runtime import kernel_checks, logits_args, validate
from rlk._runtime import temperature as temperatures
from rlk._runtime.contract import BoundKernel, Out
from rlk._runtime.operator import Grads, Operator, traced
from rlk._runtime.signature import Signature, plain, temperature_param
from rlk._runtime.spec import NativeKernel, OpSpec, Sample
from rlk._runtime.temperature import Temperature
from rlk.ops.entropy import reference
from rlk.ops.logp import op as logp_op
from rlk.ops.logp import reference as logp_reference

# ---------------------------------------------------------------------------
# argument checking: public arguments -> kernel-level arguments


def _prepare(logits: Tensor, temperature: object, mask: Tensor | None,
             rows: Tensor | None) -> tuple[dict[str, Any], tuple[int, ...]]:
    """Validate public arguments; return the kernel arguments and the output shape."""
    flat_logits, lead = logits_args.logits_rows(logits)
    keep = logits_args.keep_mask(mask, lead, logits, "the leading dimensions of logits")
    temp = temperatures.prepare(temperature, lead, logits, "logits")
    rows = logits_args.rows_arg(rows, logits)
    if validate.value_checks(logits, rows):
        logits_args.check_rows_range(rows, flat_logits.shape[0])
    args = {
        "logits": flat_logits,
        "temperature": temp,
        "mask": None if keep is None else keep.reshape(-1),
        "rows": rows,
        "out": None,
    }
    return args, (lead if rows is None else (rows.shape[0],))


def _flags(args: Mapping[str, Any]) -> tuple[Any, ...]:
    return (
        args.get("mask") is not None,
        args.get("rows") is not None,
        args.get("out") is not None,
        isinstance(args["temperature"], Tensor),
    )


# ---------------------------------------------------------------------------
# torch operators: what torch.compile and autograd see

SIGNATURE = Signature((plain("logits", "Tensor"), temperature_param(), plain("mask", "Tensor?"),
                       plain("rows", "Tensor?")), fixed={"out": None})


def _backward(kernel: BoundKernel, args: Mapping[str, Any], grads: Grads,
              needs: tuple[bool, ...]) -> Grads:
    """The kernel's backward for kernel arguments holding the forward's lse and entropy."""
    entropy = args["entropy"]
    grad = grads[0] if grads[0] is not None else torch.zeros_like(entropy)
    return (kernel.backward(grad.contiguous(), args["logits"], args["temperature"], args["mask"],
                            args["rows"], args["lse"], entropy, False),)


def _write_out(args: dict[str, Any], out: Tensor) -> None:
    """Run the forward with `out` as the kernel's buffer; copy what it wrote elsewhere."""
    entropy, _ = ENTROPY.kernel(args).forward(**args)
    if entropy.data_ptr() != out.data_ptr():
        out.copy_(entropy)


def _entropy_out(*values: Any) -> None:
    *head, out = values
    _write_out(dict(SIGNATURE.decode(head), out=out), out)


_entropy_out_op = torch.library.custom_op(
    "rlk::entropy_out", _entropy_out, mutates_args=("out",),
    schema=f"({', '.join(SIGNATURE.parameters)}, Tensor(a!) out) -> ()")
_entropy_out_op.register_fake(lambda *values: None)


def _output_meta(logits: Tensor, temperature: Temperature, mask: Tensor | None,
                 rows: Tensor | None, out: Tensor | None) -> tuple[Out | None, ...]:
    """What a forward kernel returns: entropy [R] in the compute dtype, lse [R] in float64
    (the fake is built from this too)."""
    count = logits.shape[0] if rows is None else rows.shape[0]
    return (Out((count,), logits_args.compute_dtype(logits), logits.device),
            Out((count,), torch.float64, logits.device))


def _grad_meta(grad_entropy: Tensor, logits: Tensor, *_: Any) -> tuple[Out | None, ...]:
    return (Out(tuple(logits.shape), logits.dtype, logits.device),)


# ---------------------------------------------------------------------------
# public function


def entropy(
    logits: Tensor,
    *,
    temperature: Temperature = 1.0,
    mask: Tensor | None = None,
    rows: Tensor | None = None,
    out: Tensor | None = None,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """The entropy of softmax(logits / temperature) per row, differentiable w.r.t. logits.

    logits `[..., V]` (float32/bfloat16/float16/float64); temperature a number, a 0-d
    tensor or one value per row; `mask` (the leading shape, nonzero = counts) gives 0
    and no gradient where it is zero; `rows` (int64) computes only those flat rows;
    `out` receives the result; `dtype` is the result's dtype (default float32, float64
    for float64 logits). See docs/ops/entropy.md.
    """
    args, shape = _prepare(logits, temperature, mask, rows)
    if out is not None:
        logits_args.output_dtype(dtype, logits, out)
        kernel_shape = (shape[0] if rows is not None else args["logits"].shape[0],)
        target = logits_args.out_arg(
            "out", out, shape, kernel_shape, logits,
            {"logits": logits, "mask": mask, "rows": rows,
             "temperature": temperature if isinstance(temperature, Tensor) else None})
        buffer = target.direct
        if buffer is None:
            buffer = args["logits"].new_empty(kernel_shape,
                                              dtype=logits_args.compute_dtype(logits))
        if traced(args):
            _entropy_out_op(*SIGNATURE.encode(args), buffer)
        else:
            _write_out(dict(args, out=buffer), buffer)
        return target.fill(buffer)
    result = ENTROPY.call(args)[0]
    return result.view(shape).to(logits_args.output_dtype(dtype, logits, None))


# ---------------------------------------------------------------------------
# conformance samples and the spec

# logp_entropy samples that only vary the tokens, which entropy does not read, and those
# whose ignored tokens entropy takes as masked rows
_TOKEN_ONLY = {"out-of-range", "ignore-index-custom"}
_MASKED = {"ignore-index"}


def _samples(device: torch.device, dtype: torch.dtype) -> Iterator[Sample]:
    """logp_entropy's samples without tokens (never reading values: the device may be meta)."""
    for sample in logp_op.LOGP_ENTROPY.samples(device, dtype):
        if sample.name in _TOKEN_ONLY:
            continue
        args = sample.args
        masked = sample.name in _MASKED
        out = args["out"]
        yield Sample(f"{sample.name}-as-mask" if masked else sample.name, {
            "logits": args["logits"],
            "temperature": args["temperature"],
            "mask": args["tokens"] != args["ignore_index"] if masked else None,
            "rows": args["rows"],
            "out": None if out is None else torch.empty_like(out),
        }, sample.check_backward)


def _public_prepare(logits: Tensor, *, temperature: Temperature = 1.0,
                    mask: Tensor | None = None, rows: Tensor | None = None,
                    out: Tensor | None = None,
                    dtype: torch.dtype | None = None) -> dict[str, Any]:
    args, _ = _prepare(logits, temperature, mask, rows)
    if out is not None and out.dtype == logits_args.compute_dtype(logits):
        args["out"] = out.reshape(-1)
    return args


def _reference(args: Mapping[str, Any]) -> tuple[Tensor, ...]:
    logits, temperature, mask = logp_op.selected(args, "logits", "temperature", "mask")
    return (reference.entropy(logits, temperature=temperature, mask=mask),)


def _outputs(result: Any, args: Mapping[str, Any]) -> tuple[Tensor, ...]:
    return (result[0],)


def _grad_check(kernel: Any, args: dict[str, Any], gen: torch.Generator):
    """The kernel's backward (plain and in place) against autograd over the float64 reference."""
    logits, rows, mask = args["logits"], args["rows"], args["mask"]
    count = logits.shape[0] if rows is None else rows.shape[0]
    compute = logits_args.compute_dtype(logits)
    grad_entropy = torch.randn(count, generator=gen, dtype=compute).to(logits.device)
    entropy, lse = kernel.forward(**dict(args, out=None))
    tokens = torch.zeros(logits.shape[0], dtype=torch.int64, device=logits.device)
    if mask is not None:
        tokens = tokens.masked_fill(~mask, -1)
    upstream = logp_op.spread(grad_entropy, rows, logits.shape[0])
    expected = logp_op.grad_expected(logp_reference.logp_entropy_grad(
        logits, tokens, torch.zeros_like(upstream), upstream,
        temperature=args["temperature"], ignore_index=-1), logits.dtype)
    common = (args["temperature"], mask, rows, lse, entropy)
    yield "grad_logits", kernel.backward(grad_entropy, logits, *common, False), expected
    scratch = logits.clone()
    yield "grad_logits (inplace)", kernel.backward(grad_entropy, scratch, *common, True), \
        expected


def _opcheck_case(args: dict[str, Any]) -> tuple[Any, tuple[Any, ...]]:
    logits = args["logits"].detach()
    if args["out"] is not None:
        values = SIGNATURE.encode(dict(args, logits=logits))
        return torch.ops.rlk.entropy_out.default, (*values, args["out"])
    return torch.ops.rlk.entropy.default, SIGNATURE.encode(
        dict(args, logits=logits.clone().requires_grad_(True)))


def _batch_slice(args: dict[str, Any], start: int, stop: int) -> dict[str, Any] | None:
    if args["rows"] is not None or args["out"] is not None:
        return None
    sliced = {key: args[key] for key in ("temperature", "mask")}
    for key, value in sliced.items():
        if isinstance(value, Tensor):
            sliced[key] = value[start:stop]
    return dict(args, logits=args["logits"][start:stop], **sliced)


def _nan_rule(named: Mapping[str, Any], outputs: tuple[Any, ...]) -> tuple[Tensor | bool, ...]:
    fine_rows = kernel_checks.fine_rows(named["logits"], named["temperature"])
    fine, picked = kernel_checks.selected(fine_rows, named["rows"])
    mask = named["mask"]
    unread = torch.zeros_like(fine) if mask is None else ~mask[picked]
    return ~fine & ~unread, ~fine | unread


def _shape_call(shape: Any, dtype: torch.dtype) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if len(shape) < 2:
        raise ValueError(f"takes --shape N,V (or more leading sizes, e.g. B,T,V); got {shape}")
    return (torch.empty(shape, dtype=dtype, device="meta"),), {}


ENTROPY = OpSpec(
    name="entropy",
    main_input="logits",
    prepare=_public_prepare,
    flags=_flags,
    reference=_reference,
    outputs=_outputs,
    samples=_samples,
    tolerances=logp_op.TOLERANCES,
    dtypes=logits_args.LOGITS_DTYPES,
    opcheck_case=_opcheck_case,
    grad_check=_grad_check,
    grad_tolerances=logp_op.GRAD_TOLERANCES,
    batch_slice=_batch_slice,
    operator=Operator(SIGNATURE, returns=("Tensor", "Tensor"), grad_inputs=("logits",),
                      backward=_backward, detached_outputs=(1,),
                      saved_outputs=((0, "entropy"), (1, "lse"))),
    doc="entropy of softmax(logits / T) per row",
    native=NativeKernel("rlk.ops.entropy.native:forward", "rlk.ops.entropy.native:backward"),
    output_meta=_output_meta,
    grad_meta=_grad_meta,
    shape_call=_shape_call,
    shape_help="N,V",
    nan_rule=_nan_rule,
)
