"""`logp` and `logp_entropy`: log-probabilities and entropy of tokens under softmax(logits / T)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from rlk import config, reference
from rlk.ops import temperature as temperatures
from rlk.ops import validate
from rlk.ops.contract import Out
from rlk.ops.spec import NativeKernel, OpSpec, Sample, Tolerance, register_autograd
from rlk.ops.temperature import Temperature

# ---------------------------------------------------------------------------
# argument checking: public arguments -> kernel-level arguments


def _prepare(
    logits: Tensor,
    tokens: Tensor,
    temperature: Temperature,
    ignore_index: int,
    rows: Tensor | None,
) -> tuple[dict[str, Any], tuple[int, ...]]:
    """Validate public arguments; return flattened kernel arguments and the output shape."""
    validate.tensor("logits", logits, validate.FLOATS)
    validate.tensor("tokens", tokens, validate.INDICES)
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits must be [..., V] with V >= 1; got shape {tuple(logits.shape)}")
    lead = tuple(logits.shape[:-1])
    validate.shape("tokens", tokens, lead, " (the leading dimensions of logits)")
    validate.same_device("tokens", tokens, logits, "logits")
    validate.integer("ignore_index", ignore_index)
    vocab = logits.shape[-1]
    flat_logits = logits.reshape(-1, vocab)
    flat_tokens = tokens.reshape(-1).to(torch.int64)
    temp = temperatures.prepare(temperature, lead, logits, "logits")
    out_shape = lead
    if rows is not None:
        validate.tensor("rows", rows, (torch.int64,))
        if rows.dim() != 1:
            raise ValueError(f"rows must be a 1-D int64 tensor; got shape {tuple(rows.shape)}")
        validate.same_device("rows", rows, logits, "logits")
        out_shape = (rows.shape[0],)
    args = {
        "logits": flat_logits,
        "tokens": flat_tokens,
        "temperature": temp,
        "ignore_index": ignore_index,
        "rows": rows,
    }
    if config.checking_inputs():
        _check_ranges(tokens, vocab, ignore_index, temperature, rows, flat_logits.shape[0])
    return args, out_shape


def _check_ranges(tokens: Tensor, vocab: int, ignore_index: int, temperature: Temperature,
                  rows: Tensor | None, num_rows: int) -> None:
    """The opt-in checks that need a device sync (RLK_CHECK_INPUTS=1)."""
    bad = ((tokens < 0) | (tokens >= vocab)) & (tokens != ignore_index)
    allowed = f"[0, {vocab}) and is not ignore_index={ignore_index}"
    validate.first_bad("tokens", bad, tokens, allowed)
    temperatures.check_range(temperature)
    if rows is not None:
        validate.first_bad("rows", (rows < 0) | (rows >= num_rows), rows, f"[0, {num_rows})")
        if rows.unique().numel() != rows.numel():
            raise ValueError("rows must not repeat an index (each row's gradient is written once)")


def _check_out(out: Tensor, shape: tuple[int, ...], logits: Tensor, name: str = "out") -> Tensor:
    validate.tensor(name, out, (torch.float32,))
    validate.shape(name, out, shape)
    validate.same_device(name, out, logits, "logits")
    if not out.is_contiguous():
        raise ValueError(f"{name} must be contiguous (kernels write it as a flat array)")
    if torch.is_grad_enabled() and logits.requires_grad:
        raise RuntimeError(
            f"{name}= does not support autograd; call without {name}= to differentiate"
        )
    return out.view(-1)


def _flags(args: Mapping[str, Any]) -> tuple[Any, ...]:
    return (
        args.get("with_entropy", False),
        args.get("rows") is not None,
        args.get("out") is not None,
        isinstance(args["temperature"], Tensor),
    )


def _kernel_args(logits: Tensor, tokens: Tensor, temperature: Tensor | None, value: float,
                 ignore_index: int, rows: Tensor | None, out: Tensor | None,
                 with_entropy: bool) -> dict[str, Any]:
    return {
        "logits": logits,
        "tokens": tokens,
        "temperature": temperatures.join(temperature, value),
        "ignore_index": ignore_index,
        "rows": rows,
        "out": out,
        "with_entropy": with_entropy,
    }


def _spec_for(with_entropy: bool) -> OpSpec:
    return LOGP_ENTROPY if with_entropy else LOGP


def _forward(args: dict[str, Any]) -> tuple[Tensor, Tensor | None, Tensor]:
    spec = _spec_for(args["with_entropy"])
    return spec.kernel(args).forward(**args)


# ---------------------------------------------------------------------------
# torch operators: what torch.compile and autograd see


@torch.library.custom_op("rlk::logp", mutates_args=())
def _logp_op(logits: Tensor, tokens: Tensor, temperature: Tensor | None,
             temperature_value: float, ignore_index: int,
             rows: Tensor | None) -> tuple[Tensor, Tensor]:
    args = _kernel_args(logits, tokens, temperature, temperature_value, ignore_index, rows,
                        None, False)
    logp, _, lse = _forward(args)
    return logp, lse


@torch.library.custom_op("rlk::logp_entropy", mutates_args=())
def _logp_entropy_op(logits: Tensor, tokens: Tensor, temperature: Tensor | None,
                     temperature_value: float, ignore_index: int,
                     rows: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    args = _kernel_args(logits, tokens, temperature, temperature_value, ignore_index, rows,
                        None, True)
    logp, entropy, lse = _forward(args)
    assert entropy is not None
    return logp, entropy, lse


@torch.library.custom_op("rlk::logp_out", mutates_args=("out", "entropy_out"))
def _logp_out_op(logits: Tensor, tokens: Tensor, temperature: Tensor | None,
                 temperature_value: float, ignore_index: int, rows: Tensor | None,
                 out: Tensor, entropy_out: Tensor | None) -> None:
    args = _kernel_args(logits, tokens, temperature, temperature_value, ignore_index, rows,
                        out, entropy_out is not None)
    logp, entropy, _ = _forward(args)
    if logp.data_ptr() != out.data_ptr():
        out.copy_(logp)
    if entropy_out is not None and entropy is not None:
        entropy_out.copy_(entropy)


@torch.library.custom_op("rlk::logp_backward", mutates_args=())
def _logp_backward_op(grad_logp: Tensor, grad_entropy: Tensor | None, logits: Tensor,
                      tokens: Tensor, temperature: Tensor | None, temperature_value: float,
                      ignore_index: int, rows: Tensor | None, lse: Tensor,
                      entropy: Tensor | None) -> Tensor:
    with_entropy = entropy is not None
    args = _kernel_args(logits, tokens, temperature, temperature_value, ignore_index, rows,
                        None, with_entropy)
    kernel = _spec_for(with_entropy).kernel(args)
    return kernel.backward(
        grad_logp.contiguous(),
        None if grad_entropy is None else grad_entropy.contiguous(),
        logits, tokens, args["temperature"], ignore_index, rows, lse, entropy, False,
    )


def _out_rows(logits: Tensor, rows: Tensor | None) -> int:
    return logits.shape[0] if rows is None else rows.shape[0]


@_logp_op.register_fake
def _(logits, tokens, temperature, temperature_value, ignore_index, rows):
    n = _out_rows(logits, rows)
    return logits.new_empty(n, dtype=torch.float32), logits.new_empty(n, dtype=torch.float32)


@_logp_entropy_op.register_fake
def _(logits, tokens, temperature, temperature_value, ignore_index, rows):
    n = _out_rows(logits, rows)
    return tuple(logits.new_empty(n, dtype=torch.float32) for _ in range(3))


@_logp_out_op.register_fake
def _(logits, tokens, temperature, temperature_value, ignore_index, rows, out, entropy_out):
    return None


@_logp_backward_op.register_fake
def _(grad_logp, grad_entropy, logits, tokens, temperature, temperature_value, ignore_index,
      rows, lse, entropy):
    return torch.empty_like(logits)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
    logits, tokens, temperature, temperature_value, ignore_index, rows = inputs
    entropy = output[1] if len(output) == 3 else None
    ctx.save_for_backward(logits, tokens, temperature, rows, output[-1], entropy)
    ctx.temperature_value = temperature_value
    ctx.ignore_index = ignore_index


def _logp_grad(ctx: Any, grad_logp: Tensor, grad_lse: Tensor) -> tuple[Tensor | None, ...]:
    logits, tokens, temperature, rows, lse, _ = ctx.saved_tensors
    grad = _logp_backward_op(grad_logp, None, logits, tokens, temperature,
                             ctx.temperature_value, ctx.ignore_index, rows, lse, None)
    return grad, None, None, None, None, None


def _logp_entropy_grad(ctx: Any, grad_logp: Tensor, grad_entropy: Tensor,
                       grad_lse: Tensor) -> tuple[Tensor | None, ...]:
    logits, tokens, temperature, rows, lse, entropy = ctx.saved_tensors
    grad = _logp_backward_op(grad_logp, grad_entropy, logits, tokens, temperature,
                             ctx.temperature_value, ctx.ignore_index, rows, lse, entropy)
    return grad, None, None, None, None, None


register_autograd(_logp_op, _logp_grad, _setup)
register_autograd(_logp_entropy_op, _logp_entropy_grad, _setup)


# ---------------------------------------------------------------------------
# public functions


def logp(
    logits: Tensor,
    tokens: Tensor,
    *,
    temperature: Temperature = 1.0,
    ignore_index: int = -100,
    rows: Tensor | None = None,
    out: Tensor | None = None,
) -> Tensor:
    """log softmax(logits / temperature) at `tokens`, in float32, differentiable w.r.t. logits.

    logits `[..., V]` (float32/bfloat16/float16), tokens `[...]` (int32/int64);
    temperature a float or a tensor with one value per row; `rows` (int64) computes
    only those flat rows (output `[len(rows)]`); `out` receives the result. Tokens
    equal to `ignore_index` give 0; tokens outside `[0, V)` give NaN.
    """
    args, shape = _prepare(logits, tokens, temperature, ignore_index, rows)
    temp, value = temperatures.split(args["temperature"])
    if out is not None:
        flat_out = _check_out(out, shape, logits)
        _logp_out_op(args["logits"], args["tokens"], temp, value, ignore_index, rows,
                     flat_out, None)
        return out
    result, _ = _logp_op(args["logits"], args["tokens"], temp, value, ignore_index, rows)
    return result.view(shape)


def logp_entropy(
    logits: Tensor,
    tokens: Tensor,
    *,
    temperature: Temperature = 1.0,
    ignore_index: int = -100,
    rows: Tensor | None = None,
    out: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """`logp` plus the entropy of softmax(logits / temperature), both differentiable.

    `out`, if given, is a pair of float32 tensors receiving (logp, entropy).
    """
    args, shape = _prepare(logits, tokens, temperature, ignore_index, rows)
    temp, value = temperatures.split(args["temperature"])
    if out is not None:
        if not isinstance(out, tuple) or len(out) != 2:
            raise TypeError("out must be a (logp_out, entropy_out) pair of float32 tensors")
        flat_logp = _check_out(out[0], shape, logits, "out[0]")
        flat_entropy = _check_out(out[1], shape, logits, "out[1]")
        _logp_out_op(args["logits"], args["tokens"], temp, value, ignore_index, rows,
                     flat_logp, flat_entropy)
        return out
    result, entropy, _ = _logp_entropy_op(
        args["logits"], args["tokens"], temp, value, ignore_index, rows
    )
    return result.view(shape), entropy.view(shape)


# ---------------------------------------------------------------------------
# conformance samples and the specs


def _random_logits(rows: int, vocab: int, dtype: torch.dtype, device: torch.device,
                   gen: torch.Generator) -> Tensor:
    values = torch.randn(rows, vocab, generator=gen, dtype=torch.float32) * 4.0
    return values.to(device=device, dtype=dtype)


def _random_tokens(rows: int, vocab: int, device: torch.device, gen: torch.Generator) -> Tensor:
    return torch.randint(0, vocab, (rows,), generator=gen).to(device)


def _samples(with_entropy: bool):
    def samples(device: torch.device, dtype: torch.dtype) -> Iterator[Sample]:
        gen = torch.Generator().manual_seed(1234)

        def case(name: str, rows: int, vocab: int, check_backward: bool = True, **extra: Any):
            args = {
                "logits": _random_logits(rows, vocab, dtype, device, gen),
                "tokens": _random_tokens(rows, vocab, device, gen),
                "temperature": 1.0,
                "ignore_index": -100,
                "rows": None,
                "out": None,
                "with_entropy": with_entropy,
            }
            args.update(extra)
            return Sample(name, args, check_backward)

        yield case("small", 5, 11)
        yield case("wide-odd", 7, 1031)
        yield case("vocab-one", 3, 1)
        yield case("large-vocab", 4, 40_000)
        yield case("temperature", 6, 257, temperature=0.7)
        sample = case("per-row-temperature", 6, 129)
        sample.args["temperature"] = (
            torch.rand(6, generator=gen).to(device) * 1.5 + 0.25
        )
        yield sample
        sample = case("ignore-index", 8, 64)
        sample.args["tokens"][[1, 5]] = -100
        yield sample
        sample = case("ignore-index-custom", 4, 64, ignore_index=3)
        sample.args["tokens"][2] = 3
        yield sample
        sample = case("out-of-range", 6, 50, check_backward=False)
        sample.args["tokens"][[0, 4]] = torch.tensor([50, -7], device=device)
        yield sample
        sample = case("nan-row", 5, 33, check_backward=False)
        sample.args["logits"][2, 7] = float("nan")
        yield sample
        sample = case("neg-inf-row", 5, 33, check_backward=False)
        sample.args["logits"][1] = float("-inf")
        yield sample
        sample = case("partial-neg-inf", 5, 33)
        sample.args["logits"][3, :10] = float("-inf")
        sample.args["tokens"][3] = 20
        yield sample
        sample = case("rows", 9, 77)
        sample.args["rows"] = torch.tensor([8, 0, 3, 5], device=device)
        yield sample
        sample = case("rows-empty", 4, 20)
        sample.args["rows"] = torch.zeros(0, dtype=torch.int64, device=device)
        yield sample
        sample = case("out", 6, 100, check_backward=False)
        sample.args["out"] = torch.empty(6, dtype=torch.float32, device=device)
        yield sample
        sample = case("non-contiguous", 6, 90)
        wide = _random_logits(6, 180, dtype, device, gen)
        sample.args["logits"] = wide[:, ::2]
        yield sample
        sample = case("transposed-storage", 5, 40)
        sample.args["logits"] = _random_logits(40, 5, dtype, device, gen).t()
        yield sample
        yield case("empty", 0, 16)

    return samples


def _public_prepare(with_entropy: bool):
    def prepare(logits: Tensor, tokens: Tensor, *, temperature: Temperature = 1.0,
                ignore_index: int = -100, rows: Tensor | None = None,
                out: Tensor | tuple[Tensor, Tensor] | None = None) -> dict[str, Any]:
        args, _ = _prepare(logits, tokens, temperature, ignore_index, rows)
        first = out[0] if isinstance(out, tuple) else out
        args["out"] = None if first is None else first.view(-1)
        args["with_entropy"] = with_entropy
        return args

    return prepare


def _selected(args: Mapping[str, Any]) -> tuple[Tensor, Tensor, Temperature]:
    """Logits, tokens and temperature of the rows the call computes (all, or `rows`)."""
    logits, tokens, temperature = args["logits"], args["tokens"], args["temperature"]
    rows = args.get("rows")
    if rows is not None:
        logits, tokens = logits[rows], tokens[rows]
        if isinstance(temperature, Tensor):
            temperature = temperature[rows]
    return logits, tokens, temperature


def _reference(args: Mapping[str, Any]) -> tuple[Tensor, ...]:
    logits, tokens, temperature = _selected(args)
    logp_ref, entropy_ref = reference.logp_entropy(
        logits, tokens, temperature=temperature, ignore_index=args["ignore_index"]
    )
    return (logp_ref, entropy_ref) if args["with_entropy"] else (logp_ref,)


def _outputs(result: Any, args: Mapping[str, Any]) -> tuple[Tensor, ...]:
    logp_out, entropy_out, _ = result
    return (logp_out, entropy_out) if args["with_entropy"] else (logp_out,)


def _grad_check(kernel: Any, args: dict[str, Any], gen: torch.Generator):
    """The kernel's backward (plain and in place) against autograd over the float64 reference."""
    logits, tokens, rows = args["logits"], args["tokens"], args["rows"]
    count = logits.shape[0] if rows is None else rows.shape[0]
    grad_logp = torch.randn(count, generator=gen).to(logits.device)
    grad_entropy = None
    if args["with_entropy"]:
        grad_entropy = torch.randn(count, generator=gen).to(logits.device)
    forward_args = dict(args, out=None)
    _, entropy, lse = kernel.forward(**forward_args)

    def upstream(values: Tensor) -> Tensor:
        if rows is None:
            return values
        return torch.zeros(logits.shape[0], device=values.device).index_copy(0, rows, values)

    upstream_entropy = None if grad_entropy is None else upstream(grad_entropy)
    expected = reference.logp_entropy_grad(
        logits, tokens, upstream(grad_logp), upstream_entropy,
        temperature=args["temperature"], ignore_index=args["ignore_index"],
    )
    common = (tokens, args["temperature"], args["ignore_index"], rows, lse, entropy)
    grad = kernel.backward(grad_logp, grad_entropy, logits, *common, False)
    yield "grad_logits", grad, expected
    scratch = logits.clone()
    grad_inplace = kernel.backward(grad_logp, grad_entropy, scratch, *common, True)
    yield "grad_logits (inplace)", grad_inplace, expected


def _opcheck_case(args: dict[str, Any]) -> tuple[Any, tuple[Any, ...]]:
    temp, value = temperatures.split(args["temperature"])
    common = (args["tokens"], temp, value, args["ignore_index"], args["rows"])
    logits = args["logits"].detach()
    if args["out"] is not None:
        entropy_out = torch.empty_like(args["out"]) if args["with_entropy"] else None
        return torch.ops.rlk.logp_out.default, (logits, *common, args["out"], entropy_out)
    op = torch.ops.rlk.logp_entropy.default if args["with_entropy"] else torch.ops.rlk.logp.default
    return op, (logits.clone().requires_grad_(True), *common)


def _batch_slice(args: dict[str, Any], start: int, stop: int) -> dict[str, Any] | None:
    if args["rows"] is not None or args["out"] is not None:
        return None
    temperature = args["temperature"]
    if isinstance(temperature, Tensor):
        temperature = temperature[start:stop]
    return dict(args, logits=args["logits"][start:stop], tokens=args["tokens"][start:stop],
                temperature=temperature)


def _output_meta(logits: Tensor, tokens: Tensor, temperature: Temperature, ignore_index: int,
                 rows: Tensor | None, out: Tensor | None,
                 with_entropy: bool) -> tuple[Out | None, ...]:
    row = Out((logits.shape[0] if rows is None else rows.shape[0],), torch.float32,
              logits.device)
    return row, (row if with_entropy else None), row


def _grad_meta(grad_logp: Tensor, grad_entropy: Tensor | None, logits: Tensor,
               *_: Any) -> tuple[Out | None, ...]:
    return (Out(tuple(logits.shape), logits.dtype, logits.device),)


def _shape_call(shape: Any, dtype: torch.dtype) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if len(shape) < 2:
        raise ValueError(f"takes --shape N,V (or more leading sizes, e.g. B,T,V); got {shape}")
    logits = torch.empty(shape, dtype=dtype, device="meta")
    return (logits, torch.empty(shape[:-1], dtype=torch.int64, device="meta")), {}


# Inputs are exact in every dtype (the reference upcasts the same values), so only
# float32 accumulation separates a kernel from the reference.
_TOLERANCES = {dtype: Tolerance(atol=2e-5, rtol=1e-5) for dtype in validate.FLOATS}
# Gradients are written in the logits' dtype: one rounding to that dtype is allowed.
_GRAD_TOLERANCES = {
    torch.float32: Tolerance(atol=1e-6, rtol=1e-4),
    torch.bfloat16: Tolerance(atol=1e-6, rtol=8e-3),
    torch.float16: Tolerance(atol=1e-6, rtol=1e-3),
}

def _spec(name: str, with_entropy: bool, doc: str) -> OpSpec:
    return OpSpec(
        name=name,
        main_input="logits",
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
        doc=doc,
        native=NativeKernel("rlk.native.logp:forward", "rlk.native.logp:backward"),
        output_meta=_output_meta,
        grad_meta=_grad_meta,
        shape_call=_shape_call,
        shape_help="N,V",
    )


LOGP = _spec("logp", False, "log softmax(logits / T) at tokens")
LOGP_ENTROPY = _spec("logp_entropy", True, "logp and the entropy of softmax(logits / T)")
