"""`logp` and `logp_entropy`: log-probabilities of tokens under softmax(logits / T), and the
entropy of that softmax."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from rlk._runtime import kernel_checks, logits_args, validate
from rlk._runtime import temperature as temperatures
from rlk._runtime.contract import BoundKernel, Out
from rlk._runtime.operator import Grads, Operator, traced
from rlk._runtime.signature import Signature, plain, temperature_param
from rlk._runtime.spec import NativeKernel, OpSpec, Tolerance
from rlk._runtime.temperature import Temperature
from rlk.ops.logp import reference
from rlk.ops.logp.samples import samples_for

# ---------------------------------------------------------------------------
# argument checking: public arguments -> kernel-level arguments


def _tokens_per_row(tokens: Tensor, lead: tuple[int, ...], with_entropy: bool) -> int | None:
    """None when `tokens` holds one token per row (the leading shape of logits), else K
    for `[..., K]` (K tokens per row, gathered by `logp` only)."""
    shape = tuple(tokens.shape)
    if shape == lead:
        return None
    if not with_entropy and shape[:-1] == lead and len(shape) == len(lead) + 1:
        return shape[-1]
    gathers = "" if with_entropy else f" or {(*lead, 'K')} (K tokens per row)"
    raise ValueError(f"tokens must have shape {lead} (the leading dimensions of logits)"
                     f"{gathers}; got {shape}")


def _prepare(logits: Tensor, tokens: Tensor, temperature: object, ignore_index: object,
             mask: Tensor | None, rows: Tensor | None,
             with_entropy: bool) -> tuple[dict[str, Any], tuple[int, ...]]:
    """Validate public arguments; return the kernel arguments and the output shape."""
    flat_logits, lead = logits_args.logits_rows(logits)
    validate.tensor("tokens", tokens, validate.INDICES)
    validate.same_device("tokens", tokens, logits, "logits")
    per_row = _tokens_per_row(tokens, lead, with_entropy)
    ignore = validate.integer("ignore_index", ignore_index)
    keep = logits_args.keep_mask(mask, tuple(tokens.shape), logits, "the shape of tokens")
    num_rows = flat_logits.shape[0]
    # K = 1 gathers as one token per row, which every backend serves
    columns = () if per_row in (None, 1) else (per_row,)
    flat_tokens = tokens if tokens.dtype == torch.int64 else tokens.to(torch.int64)
    if flat_tokens.shape != (num_rows, *columns):
        flat_tokens = flat_tokens.reshape(num_rows, *columns)
    if keep is not None:
        flat_tokens = flat_tokens.masked_fill(~keep.reshape(flat_tokens.shape), ignore)
    temp = temperatures.prepare(temperature, lead, logits, "logits")
    rows = logits_args.rows_arg(rows, logits)
    selected = lead if rows is None else (rows.shape[0],)
    out_shape = selected if per_row is None else (*selected, per_row)
    if validate.value_checks(logits, tokens, rows):
        _check_ranges(flat_tokens.reshape(tokens.shape), flat_logits.shape[1], ignore)
        logits_args.check_rows_range(rows, num_rows)
    args = {
        "logits": flat_logits,
        "tokens": flat_tokens,
        "temperature": temp,
        "ignore_index": ignore,
        "rows": rows,
        "out": None,
        "with_entropy": with_entropy,
    }
    return args, out_shape


def _check_ranges(tokens: Tensor, vocab: int, ignore_index: int) -> None:
    """The opt-in check of token ids (RLK_CHECK_INPUTS=1); masked tokens are ignored."""
    bad = ((tokens < 0) | (tokens >= vocab)) & (tokens != ignore_index)
    allowed = f"[0, {vocab}) and is not ignore_index={ignore_index}"
    validate.first_bad("tokens", bad, tokens, allowed)


def one_token_per_row(tokens: Tensor, **_: object) -> str | None:
    """A `check` for logp kernels that gather one token per row: declines `[M, K]` tokens
    (`logp(tokens=[..., K])`), which then fall back to a backend that gathers K."""
    if tokens.dim() == 2:
        return "gathers one token per row; [M, K] tokens (K per row) need another backend"
    return None


def _kernel_shape(args: Mapping[str, Any]) -> tuple[int, ...]:
    rows = args["rows"]
    count = args["logits"].shape[0] if rows is None else rows.shape[0]
    return (count, *args["tokens"].shape[1:])


def _flags(args: Mapping[str, Any]) -> tuple[Any, ...]:
    return (
        args.get("with_entropy", False),
        args.get("rows") is not None,
        args.get("out") is not None,
        isinstance(args["temperature"], Tensor),
        args["tokens"].dim() == 2,
    )


def _spec_for(with_entropy: bool) -> OpSpec:
    return LOGP_ENTROPY if with_entropy else LOGP


def _forward(args: dict[str, Any]) -> tuple[Tensor, Tensor | None, Tensor]:
    spec = _spec_for(args["with_entropy"])
    return spec.kernel(args).forward(**args)


def _write_out(args: dict[str, Any], out: Tensor, entropy_out: Tensor | None) -> None:
    """Run the forward with `out` as the kernel's buffer; copy what it wrote elsewhere."""
    logp, entropy, _ = _forward(args)
    if logp.data_ptr() != out.data_ptr():
        out.copy_(logp)
    if entropy_out is not None and entropy is not None:
        entropy_out.copy_(entropy)


# ---------------------------------------------------------------------------
# torch operators: what torch.compile and autograd see


def _signature(with_entropy: bool) -> Signature:
    return Signature((plain("logits", "Tensor"), plain("tokens", "Tensor"), temperature_param(),
                      plain("ignore_index", "int"), plain("rows", "Tensor?")),
                     fixed={"out": None, "with_entropy": with_entropy})


SIGNATURES = {False: _signature(False), True: _signature(True)}


def _backward(kernel: BoundKernel, args: Mapping[str, Any], grads: Grads,
              needs: tuple[bool, ...]) -> Grads:
    """The kernel's backward for kernel arguments holding the forward's lse and entropy; an
    output without a gradient counts as zeros."""
    grad_logp, grad_entropy = grads[0], grads[1]
    missing_entropy = grad_entropy is None and args["entropy"] is not None
    if grad_logp is None or missing_entropy:
        logits = args["logits"]
        zeros = torch.zeros(_kernel_shape(args), dtype=logits_args.compute_dtype(logits),
                            device=logits.device)
        grad_logp = zeros if grad_logp is None else grad_logp
        grad_entropy = zeros if missing_entropy else grad_entropy
    return (kernel.backward(
        grad_logp.contiguous(), None if grad_entropy is None else grad_entropy.contiguous(),
        args["logits"], args["tokens"], args["temperature"], args["ignore_index"], args["rows"],
        args["lse"], args["entropy"], False,
    ),)


def _operator(with_entropy: bool) -> Operator:
    return Operator(SIGNATURES[with_entropy],
                    returns=("Tensor", "Tensor" if with_entropy else None, "Tensor"),
                    grad_inputs=("logits",), backward=_backward, detached_outputs=(2,),
                    saved_outputs=((1, "entropy"), (2, "lse")))


def _logp_out(*values: Any) -> None:
    *head, out, entropy_out = values
    args = SIGNATURES[entropy_out is not None].decode(head)
    _write_out(dict(args, out=out), out, entropy_out)


_logp_out_op = torch.library.custom_op(
    "rlk::logp_out", _logp_out, mutates_args=("out", "entropy_out"),
    schema=f"({', '.join(SIGNATURES[False].parameters)}, Tensor(a!) out, "
           "Tensor(b!)? entropy_out) -> ()")
_logp_out_op.register_fake(lambda *values: None)


def _out_call(args: dict[str, Any], out: Tensor, entropy_out: Tensor | None) -> None:
    """The `out=` forward (never differentiable): the kernel itself when nothing traces the
    call, else the rlk::logp_out operator."""
    if traced(args):
        _logp_out_op(*SIGNATURES[False].encode(args), out, entropy_out)
    else:
        _write_out(dict(args, out=out), out, entropy_out)


def _output_meta(logits: Tensor, tokens: Tensor, temperature: Temperature, ignore_index: int,
                 rows: Tensor | None, out: Tensor | None,
                 with_entropy: bool) -> tuple[Out | None, ...]:
    """What a forward kernel returns: logp [R] ([R, K]) and entropy [R] in the compute
    dtype, lse [R] in float64 (the fakes are built from this too)."""
    count = logits.shape[0] if rows is None else rows.shape[0]
    dtype = logits_args.compute_dtype(logits)
    return (Out((count, *tokens.shape[1:]), dtype, logits.device),
            Out((count,), dtype, logits.device) if with_entropy else None,
            Out((count,), torch.float64, logits.device))


def _grad_meta(grad_logp: Tensor, grad_entropy: Tensor | None, logits: Tensor,
               *_: Any) -> tuple[Out | None, ...]:
    return (Out(tuple(logits.shape), logits.dtype, logits.device),)


# ---------------------------------------------------------------------------
# public functions


def _inputs(logits: Tensor, tokens: Tensor, temperature: object, mask: Tensor | None,
            rows: Tensor | None) -> dict[str, Tensor | None]:
    """The caller's tensors an `out=` must not share memory with."""
    return {"logits": logits, "tokens": tokens, "mask": mask, "rows": rows,
            "temperature": temperature if isinstance(temperature, Tensor) else None}


def logp(
    logits: Tensor,
    tokens: Tensor,
    *,
    temperature: Temperature = 1.0,
    ignore_index: int = -100,
    mask: Tensor | None = None,
    rows: Tensor | None = None,
    out: Tensor | None = None,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """log softmax(logits / temperature) at `tokens`, differentiable w.r.t. logits.

    logits `[..., V]` (float32/bfloat16/float16/float64); tokens `[...]` (one per row) or
    `[..., K]` (K per row), int32/int64; temperature a number, a 0-d tensor or one value
    per row; `mask` (tokens' shape, nonzero = counts) and `ignore_index` give 0 where
    they exclude a token; `rows` (int64) computes only those flat rows; `out` receives
    the result; `dtype` is the result's dtype (default float32, float64 for float64
    logits). Tokens outside `[0, V)` give NaN. See docs/ops/logp.md.
    """
    args, shape = _prepare(logits, tokens, temperature, ignore_index, mask, rows, False)
    wanted = logits_args.output_dtype(dtype, logits, out)
    if out is not None:
        target = logits_args.out_arg("out", out, shape, _kernel_shape(args), logits,
                                     _inputs(logits, tokens, temperature, mask, rows))
        buffer = target.direct
        if buffer is None:
            buffer = args["logits"].new_empty(_kernel_shape(args),
                                              dtype=logits_args.compute_dtype(logits))
        _out_call(args, buffer, None)
        return target.fill(buffer)
    result = LOGP.call(args)[0]
    return result.view(shape).to(wanted)


def logp_entropy(
    logits: Tensor,
    tokens: Tensor,
    *,
    temperature: Temperature = 1.0,
    ignore_index: int = -100,
    mask: Tensor | None = None,
    rows: Tensor | None = None,
    out: tuple[Tensor, Tensor] | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor]:
    """`logp` plus the entropy of softmax(logits / temperature), both differentiable.

    One token per row. A row whose token is excluded (ignore_index or mask) gives logp 0
    and entropy 0. `out`, if given, is a pair of tensors receiving (logp, entropy).
    """
    args, shape = _prepare(logits, tokens, temperature, ignore_index, mask, rows, True)
    if out is not None:
        if not isinstance(out, tuple) or len(out) != 2:
            raise TypeError("out must be a (logp_out, entropy_out) pair of tensors")
        if out[0].dtype != out[1].dtype:
            raise TypeError(f"out[0] and out[1] must have one dtype; got {out[0].dtype} "
                            f"and {out[1].dtype}")
        logits_args.output_dtype(dtype, logits, out[0])
        inputs = _inputs(logits, tokens, temperature, mask, rows)
        kernel_shape = _kernel_shape(args)
        first = logits_args.out_arg("out[0]", out[0], shape, kernel_shape, logits,
                                    {**inputs, "out[1]": out[1]})
        second = logits_args.out_arg("out[1]", out[1], shape, kernel_shape, logits, inputs)
        compute = logits_args.compute_dtype(logits)
        buffers = [target.direct if target.direct is not None
                   else args["logits"].new_empty(kernel_shape, dtype=compute)
                   for target in (first, second)]
        _out_call(args, buffers[0], buffers[1])
        return first.fill(buffers[0]), second.fill(buffers[1])
    wanted = logits_args.output_dtype(dtype, logits, None)
    result, entropy, _ = LOGP_ENTROPY.call(args)
    return result.view(shape).to(wanted), entropy.view(shape).to(wanted)


# ---------------------------------------------------------------------------
# the specs and what the conformance kit compares


def _public_prepare(with_entropy: bool):
    def prepare(logits: Tensor, tokens: Tensor, *, temperature: Temperature = 1.0,
                ignore_index: int = -100, mask: Tensor | None = None,
                rows: Tensor | None = None,
                out: Tensor | tuple[Tensor, Tensor] | None = None,
                dtype: torch.dtype | None = None) -> dict[str, Any]:
        args, _ = _prepare(logits, tokens, temperature, ignore_index, mask, rows, with_entropy)
        first = out[0] if isinstance(out, tuple) else out
        if first is not None and first.dtype == logits_args.compute_dtype(logits):
            args["out"] = first.reshape(_kernel_shape(args))
        return args

    return prepare


def selected(args: Mapping[str, Any], *names: str) -> tuple[Any, ...]:
    """The named per-row kernel arguments restricted to the rows the call computes."""
    rows = args.get("rows")
    values = tuple(args[name] for name in names)
    if rows is None:
        return values
    return tuple(v[rows] if isinstance(v, Tensor) and v.dim() > 0 else v for v in values)


def in_compute_range(values: Tensor, logits: Tensor) -> Tensor:
    """A float64 reference as the kernel's dtype can hold it: magnitudes beyond its largest
    finite value (1 / T can make logits / T that large) become infinite."""
    limit = torch.finfo(logits_args.compute_dtype(logits)).max
    huge = values.abs() > limit
    return torch.where(huge, values.sign() * math.inf, values)


def _reference(args: Mapping[str, Any]) -> tuple[Tensor, ...]:
    logits, tokens, temperature = selected(args, "logits", "tokens", "temperature")
    logp_ref, entropy_ref = reference.logp_entropy(
        logits, tokens, temperature=temperature, ignore_index=args["ignore_index"]
    )
    logp_ref = in_compute_range(logp_ref, logits)
    return (logp_ref, entropy_ref) if args["with_entropy"] else (logp_ref,)


def _outputs(result: Any, args: Mapping[str, Any]) -> tuple[Tensor, ...]:
    logp_out, entropy_out, _ = result
    return (logp_out, entropy_out) if args["with_entropy"] else (logp_out,)


def spread(values: Tensor, rows: Tensor | None, num_rows: int) -> Tensor:
    """Per-selected-row values as per-logits-row ones: a row selected twice gets the sum."""
    if rows is None:
        return values
    full = values.new_zeros((num_rows, *values.shape[1:]))
    return full.index_add(0, rows, values)


def grad_expected(expected: Tensor, grad_dtype: torch.dtype) -> Tensor:
    """A float64 reference gradient as a gradient of `grad_dtype` can hold it."""
    limit = torch.finfo(grad_dtype).max
    return torch.where(expected.abs() > limit, expected.sign() * math.inf, expected)


def _grad_check(kernel: Any, args: dict[str, Any], gen: torch.Generator):
    """The kernel's backward (plain and in place) against autograd over the float64 reference."""
    logits, tokens, rows = args["logits"], args["tokens"], args["rows"]
    shape = _kernel_shape(args)
    compute = logits_args.compute_dtype(logits)
    grad_logp = torch.randn(shape, generator=gen, dtype=compute).to(logits.device)
    grad_entropy = None
    if args["with_entropy"]:
        grad_entropy = torch.randn(shape[0], generator=gen, dtype=compute).to(logits.device)
    forward_args = dict(args, out=None)
    _, entropy, lse = kernel.forward(**forward_args)
    num_rows = logits.shape[0]
    upstream_entropy = None if grad_entropy is None else spread(grad_entropy, rows, num_rows)
    expected = grad_expected(reference.logp_entropy_grad(
        logits, tokens, spread(grad_logp, rows, num_rows), upstream_entropy,
        temperature=args["temperature"], ignore_index=args["ignore_index"],
    ), logits.dtype)
    common = (tokens, args["temperature"], args["ignore_index"], rows, lse, entropy)
    grad = kernel.backward(grad_logp, grad_entropy, logits, *common, False)
    yield "grad_logits", grad, expected
    scratch = logits.clone()
    grad_inplace = kernel.backward(grad_logp, grad_entropy, scratch, *common, True)
    yield "grad_logits (inplace)", grad_inplace, expected


def _opcheck_case(args: dict[str, Any]) -> tuple[Any, tuple[Any, ...]]:
    logits = args["logits"].detach()
    if args["out"] is not None:
        entropy_out = torch.empty_like(args["out"]) if args["with_entropy"] else None
        values = SIGNATURES[False].encode(dict(args, logits=logits))
        return torch.ops.rlk.logp_out.default, (*values, args["out"], entropy_out)
    op = torch.ops.rlk.logp_entropy.default if args["with_entropy"] else torch.ops.rlk.logp.default
    return op, SIGNATURES[False].encode(dict(args, logits=logits.clone().requires_grad_(True)))


def _batch_slice(args: dict[str, Any], start: int, stop: int) -> dict[str, Any] | None:
    if args["rows"] is not None or args["out"] is not None:
        return None
    temperature = args["temperature"]
    if isinstance(temperature, Tensor):
        temperature = temperature[start:stop]
    return dict(args, logits=args["logits"][start:stop], tokens=args["tokens"][start:stop],
                temperature=temperature)


# Inputs are exact in every dtype (the reference upcasts the same values), so only
# the compute dtype's accumulation separates a kernel from the reference.
TOLERANCES = {dtype: Tolerance(atol=2e-5, rtol=1e-5) for dtype in validate.FLOATS}
TOLERANCES[torch.float64] = Tolerance(atol=1e-12, rtol=1e-10)
# Gradients are written in the logits' dtype: one rounding to that dtype is allowed.
GRAD_TOLERANCES = {
    torch.float32: Tolerance(atol=1e-6, rtol=1e-4),
    torch.bfloat16: Tolerance(atol=1e-6, rtol=8e-3),
    torch.float16: Tolerance(atol=1e-6, rtol=1e-3),
    torch.float64: Tolerance(atol=1e-12, rtol=1e-9),
}


def _nan_rule(named: Mapping[str, Any], outputs: tuple[Any, ...]) -> tuple[Tensor | bool, ...]:
    logits, tokens = named["logits"], named["tokens"]
    fine_rows = kernel_checks.fine_rows(logits, named["temperature"])
    fine, picked = kernel_checks.selected(fine_rows, named["rows"])
    tok = tokens[picked]
    ignored = tok == named["ignore_index"]
    token_fine = ((tok >= 0) & (tok < logits.shape[-1])) | ignored
    per_token = fine.unsqueeze(1) if tok.dim() == 2 else fine
    any_ignored = ignored.any(dim=1) if tok.dim() == 2 else ignored
    return ~(per_token & token_fine), ~fine, ~fine | any_ignored  # lse: unread when ignored


def _shape_call(shape: Any, dtype: torch.dtype) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if len(shape) < 2:
        raise ValueError(f"takes --shape N,V (or more leading sizes, e.g. B,T,V); got {shape}")
    logits = torch.empty(shape, dtype=dtype, device="meta")
    return (logits, torch.empty(shape[:-1], dtype=torch.int64, device="meta")), {}


def _spec(name: str, with_entropy: bool, doc: str) -> OpSpec:
    return OpSpec(
        name=name,
        main_input="logits",
        prepare=_public_prepare(with_entropy),
        flags=_flags,
        reference=_reference,
        outputs=_outputs,
        samples=samples_for(with_entropy),
        tolerances=TOLERANCES,
        dtypes=logits_args.LOGITS_DTYPES,
        opcheck_case=_opcheck_case,
        grad_check=_grad_check,
        grad_tolerances=GRAD_TOLERANCES,
        batch_slice=_batch_slice,
        operator=_operator(with_entropy),
        doc=doc,
        native=NativeKernel("rlk.ops.logp.native:forward", "rlk.ops.logp.native:backward"),
        output_meta=_output_meta,
        grad_meta=_grad_meta,
        shape_call=_shape_call,
        shape_help="N,V",
        nan_rule=_nan_rule,
    )


LOGP = _spec("logp", False, "log softmax(logits / T) at tokens")
LOGP_ENTROPY = _spec("logp_entropy", True, "logp and the entropy of softmax(logits / T)")
