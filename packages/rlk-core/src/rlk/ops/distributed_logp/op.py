"""`distributed_logp` and `distributed_logp_entropy`: `logp` of logits already sharded by
vocabulary over a process group (for example the output of a column-parallel LM head).

Public as `rlk.distributed.logp` / `logp_entropy`. Each rank passes its contiguous slice
of the vocabulary (rank order, sizes may differ) and the same tokens, temperature and
upstream gradient (replicated, as in Megatron-style tensor parallelism); every rank gets
the values of `rlk.logp` on the concatenated logits. The shard math is rlk._runtime.shards.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from rlk import config
from rlk._runtime import shards, validate
from rlk._runtime import temperature as temperatures
from rlk._runtime.contract import Out
from rlk._runtime.spec import GradCase, NativeKernel, OpSpec, Sample, register_autograd
from rlk._runtime.temperature import Temperature
from rlk.ops.logp import reference
from rlk.ops.logp.op import LOGP

# ---------------------------------------------------------------------------
# argument checking: public arguments -> kernel-level arguments


def _prepare(logits: Tensor, tokens: Tensor, group: Any, temperature: Temperature,
             ignore_index: int, with_entropy: bool) -> tuple[dict[str, Any], tuple[int, ...]]:
    """Validated, flattened kernel arguments and the output shape."""
    if group is None:
        raise TypeError("group is required: the process group the vocabulary is sharded over")
    shards.group_name(group)
    validate.tensor("logits", logits, validate.FLOATS)
    validate.tensor("tokens", tokens, validate.INDICES)
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits must be [..., V_local] with V_local >= 1; "
                         f"got shape {tuple(logits.shape)}")
    lead = tuple(logits.shape[:-1])
    validate.shape("tokens", tokens, lead, " (the leading dimensions of logits)")
    validate.same_device("tokens", tokens, logits, "logits")
    validate.integer("ignore_index", ignore_index)
    flat_tokens = tokens.reshape(-1).to(torch.int64)
    temp = temperatures.prepare(temperature, lead, logits, "logits")
    if config.checking_inputs():
        shards.check_tokens(flat_tokens, shards.layout(logits.shape[-1], group,
                                                       logits.device).total, ignore_index)
    args = {"logits": logits.reshape(-1, logits.shape[-1]), "tokens": flat_tokens,
            "temperature": temp, "ignore_index": ignore_index, "group": group,
            "with_entropy": with_entropy}
    return args, lead


def _flags(args: Mapping[str, Any]) -> tuple[Any, ...]:
    return args["with_entropy"], isinstance(args["temperature"], Tensor)


def _kernel_args(logits: Tensor, tokens: Tensor, temperature: Tensor | None, value: float,
                 ignore_index: int, group: str, with_entropy: bool) -> dict[str, Any]:
    return {"logits": logits, "tokens": tokens,
            "temperature": temperatures.join(temperature, value), "ignore_index": ignore_index,
            "group": shards.resolve_group(group), "with_entropy": with_entropy}


def _spec_for(with_entropy: bool) -> OpSpec:
    return DISTRIBUTED_LOGP_ENTROPY if with_entropy else DISTRIBUTED_LOGP


# ---------------------------------------------------------------------------
# torch operators


@torch.library.custom_op("rlk::distributed_logp", mutates_args=())
def _distributed_op(logits: Tensor, tokens: Tensor, temperature: Tensor | None,
                    temperature_value: float, ignore_index: int, group: str,
                    with_entropy: bool) -> tuple[Tensor, Tensor, Tensor]:
    args = _kernel_args(logits, tokens, temperature, temperature_value, ignore_index, group,
                        with_entropy)
    logp, entropy, lse = _spec_for(with_entropy).kernel(args).forward(**args)
    return logp, (torch.zeros_like(logp) if entropy is None else entropy), lse


@torch.library.custom_op("rlk::distributed_logp_backward", mutates_args=())
def _distributed_backward_op(grad_logp: Tensor, grad_entropy: Tensor | None, logits: Tensor,
                             tokens: Tensor, temperature: Tensor | None,
                             temperature_value: float, ignore_index: int, group: str,
                             lse: Tensor, entropy: Tensor | None) -> Tensor:
    args = _kernel_args(logits, tokens, temperature, temperature_value, ignore_index, group,
                        entropy is not None)
    return _spec_for(entropy is not None).kernel(args).backward(
        grad_logp.contiguous(), None if grad_entropy is None else grad_entropy.contiguous(),
        logits, tokens, args["temperature"], ignore_index, args["group"], lse, entropy,
    )


@_distributed_op.register_fake
def _(logits, tokens, temperature, temperature_value, ignore_index, group, with_entropy):
    rows = logits.shape[0]  # logp and entropy (zeros without it) in float32, lse in float64
    return (*(logits.new_empty(rows, dtype=torch.float32) for _ in range(2)),
            logits.new_empty(rows, dtype=torch.float64))


@_distributed_backward_op.register_fake
def _(grad_logp, grad_entropy, logits, tokens, temperature, temperature_value, ignore_index,
      group, lse, entropy):
    return torch.empty_like(logits)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
    logits, tokens, temperature, temperature_value, ignore_index, group, with_entropy = inputs
    ctx.save_for_backward(logits, tokens, temperature, output[2],
                          output[1] if with_entropy else None)
    ctx.options = (temperature_value, ignore_index, group, with_entropy)


def _grad(ctx: Any, grad_logp: Tensor, grad_entropy: Tensor,
          grad_lse: Tensor) -> tuple[Tensor | None, ...]:
    logits, tokens, temperature, lse, entropy = ctx.saved_tensors
    temperature_value, ignore_index, group, with_entropy = ctx.options
    grad = _distributed_backward_op(grad_logp, grad_entropy if with_entropy else None, logits,
                                    tokens, temperature, temperature_value, ignore_index, group,
                                    lse, entropy)
    return grad, None, None, None, None, None, None


register_autograd(_distributed_op, _grad, _setup)


# ---------------------------------------------------------------------------
# public functions (rlk.distributed)


def _call(logits: Tensor, tokens: Tensor, group: Any, temperature: Temperature,
          ignore_index: int, with_entropy: bool) -> tuple[Tensor, Tensor]:
    args, shape = _prepare(logits, tokens, group, temperature, ignore_index, with_entropy)
    temp, value = temperatures.split(args["temperature"])
    result, entropy, _ = _distributed_op(args["logits"], args["tokens"], temp, value,
                                         ignore_index, shards.group_name(group), with_entropy)
    return result.view(shape), entropy.view(shape)


def logp(logits: Tensor, tokens: Tensor, *, group: dist.ProcessGroup,
         temperature: Temperature = 1.0, ignore_index: int = -100) -> Tensor:
    """`rlk.logp` for logits sharded by vocabulary over `group` (contiguous, in rank order).

    logits `[..., V_local]` on each rank; tokens `[...]` hold global vocabulary ids
    and are the same on every rank; the result (also the same on every rank) equals
    `rlk.logp` on the concatenated logits. Differentiable w.r.t. this rank's logits.
    """
    return _call(logits, tokens, group, temperature, ignore_index, False)[0]


def logp_entropy(logits: Tensor, tokens: Tensor, *, group: dist.ProcessGroup,
                 temperature: Temperature = 1.0,
                 ignore_index: int = -100) -> tuple[Tensor, Tensor]:
    """`logp` plus the entropy of the full (all-shard) softmax, both differentiable."""
    return _call(logits, tokens, group, temperature, ignore_index, True)


# ---------------------------------------------------------------------------
# conformance samples and the specs


def single_rank_group(device: torch.device) -> dist.ProcessGroup:
    """A process group of one rank, so that the kit can run the distributed ops anywhere:
    the default group when initialised, else a new in-process one (gloo, plus NCCL for
    CUDA tensors where torch has it)."""
    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if (device.type == "cuda"
                                           and dist.is_nccl_available()) else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    assert dist.group.WORLD is not None
    return dist.group.WORLD


def _samples(with_entropy: bool):
    def samples(device: torch.device, dtype: torch.dtype) -> Iterator[Sample]:
        """One rank holding the whole vocabulary (nothing to do where the default group is
        wider: the reference would need the other ranks' slices). On the meta device the
        samples carry no group: they describe calls, nothing runs."""
        group = None if device.type == "meta" else single_rank_group(device)
        if group is not None and dist.get_world_size(group) != 1:
            return
        gen = torch.Generator().manual_seed(808)

        def case(name: str, rows: int, vocab: int, check_backward: bool = True,
                 **extra: Any) -> Sample:
            args = {
                "logits": (torch.randn(rows, vocab, generator=gen) * 4).to(device, dtype),
                "tokens": torch.randint(0, vocab, (rows,), generator=gen).to(device),
                "temperature": 1.0, "ignore_index": -100, "group": group,
                "with_entropy": with_entropy,
            }
            args.update(extra)
            return Sample(name, args, check_backward)

        yield case("small", 5, 11)
        yield case("temperature", 6, 300, temperature=0.7)
        sample = case("per-row-temperature", 6, 129)
        sample.args["temperature"] = (torch.rand(6, generator=gen) * 1.5 + 0.25).to(device)
        yield sample
        sample = case("ignore-index", 7, 40)
        sample.args["tokens"][[1, 4]] = -100
        yield sample
        sample = case("out-of-range", 5, 30, check_backward=False)
        sample.args["tokens"][[0, 3]] = torch.tensor([30, -5], device=device)
        yield sample
        sample = case("neg-inf-row", 4, 21, check_backward=False)
        sample.args["logits"][2] = float("-inf")
        yield sample
        yield case("empty", 0, 16)

    return samples


def _public_prepare(with_entropy: bool):
    def prepare(logits: Tensor, tokens: Tensor, *, group: Any = None,
                temperature: Temperature = 1.0, ignore_index: int = -100) -> dict[str, Any]:
        return _prepare(logits, tokens, group, temperature, ignore_index, with_entropy)[0]

    return prepare


def _reference(args: Mapping[str, Any]) -> tuple[Tensor, ...]:
    """With one rank, the slice is the whole vocabulary: plain logp is the truth."""
    logp_ref, entropy_ref = reference.logp_entropy(
        args["logits"], args["tokens"], temperature=args["temperature"],
        ignore_index=args["ignore_index"],
    )
    return (logp_ref, entropy_ref) if args["with_entropy"] else (logp_ref,)


def _outputs(result: Any, args: Mapping[str, Any]) -> tuple[Tensor, ...]:
    logp_out, entropy_out, _ = result
    return (logp_out, entropy_out) if args["with_entropy"] else (logp_out,)


def _grad_check(kernel: Any, args: dict[str, Any], gen: torch.Generator) -> Iterator[GradCase]:
    logits, tokens = args["logits"], args["tokens"]
    grad_logp = torch.randn(logits.shape[0], generator=gen).to(logits.device)
    grad_entropy = (torch.randn(logits.shape[0], generator=gen).to(logits.device)
                    if args["with_entropy"] else None)
    _, entropy, lse = kernel.forward(**args)
    expected = reference.logp_entropy_grad(
        logits, tokens, grad_logp, grad_entropy, temperature=args["temperature"],
        ignore_index=args["ignore_index"],
    )
    got = kernel.backward(grad_logp, grad_entropy, logits, tokens, args["temperature"],
                          args["ignore_index"], args["group"], lse, entropy)
    yield "grad_logits", got, expected


def _opcheck_case(args: dict[str, Any]) -> tuple[Any, tuple[Any, ...]]:
    temp, value = temperatures.split(args["temperature"])
    logits = args["logits"].detach().clone().requires_grad_(True)
    return torch.ops.rlk.distributed_logp.default, (
        logits, args["tokens"], temp, value, args["ignore_index"],
        shards.group_name(args["group"]), args["with_entropy"],
    )


def _batch_slice(args: dict[str, Any], start: int, stop: int) -> dict[str, Any]:
    temperature = args["temperature"]
    if isinstance(temperature, Tensor):
        temperature = temperature[start:stop]
    return dict(args, logits=args["logits"][start:stop], tokens=args["tokens"][start:stop],
                temperature=temperature)


def _output_meta(logits: Tensor, tokens: Tensor, temperature: Temperature, ignore_index: int,
                 group: Any, with_entropy: bool) -> tuple[Out | None, ...]:
    row = Out((logits.shape[0],), torch.float32, logits.device)
    # the merged lse is float64, as the logp kernels' is
    return row, (row if with_entropy else None), Out((logits.shape[0],), torch.float64,
                                                     logits.device)


def _grad_meta(grad_logp: Tensor, grad_entropy: Tensor | None, logits: Tensor,
               *_: Any) -> tuple[Out | None, ...]:
    return (Out(tuple(logits.shape), logits.dtype, logits.device),)


def _shape_call(shape: Any, dtype: torch.dtype) -> tuple[tuple[Any, ...], dict[str, Any]]:
    raise ValueError("the distributed ops need a process group, which a shape cannot give: "
                     "explain them from Python with rlk.explain(op, logits, tokens, group=...)")


def _spec(name: str, with_entropy: bool, doc: str) -> OpSpec:
    return OpSpec(
        name=name,
        main_input="logits",
        prepare=_public_prepare(with_entropy),
        flags=_flags,
        reference=_reference,
        outputs=_outputs,
        samples=_samples(with_entropy),
        tolerances=LOGP.tolerances,  # the values logp gives, so logp's tolerances
        dtypes=validate.FLOATS,
        opcheck_case=_opcheck_case,
        grad_check=_grad_check,
        grad_tolerances=LOGP.grad_tolerances,
        batch_slice=_batch_slice,
        doc=doc,
        native=NativeKernel("rlk.ops.distributed_logp.native:forward",
                            "rlk.ops.distributed_logp.native:backward",
                            uses=("logp_entropy" if with_entropy else "logp",)),
        output_meta=_output_meta,
        grad_meta=_grad_meta,
        shape_call=_shape_call,
        shape_help="(needs a process group: explain it from Python)",
    )


DISTRIBUTED_LOGP = _spec("distributed_logp", False,
                         "rlk.distributed.logp: logp of logits sharded by vocabulary")
DISTRIBUTED_LOGP_ENTROPY = _spec("distributed_logp_entropy", True,
                                 "rlk.distributed.logp_entropy: logp and entropy of logits "
                                 "sharded by vocabulary")
