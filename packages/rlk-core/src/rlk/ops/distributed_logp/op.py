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

from rlk._runtime import shards, validate
from rlk._runtime import temperature as temperatures
from rlk._runtime.contract import BoundKernel, Out
from rlk._runtime.operator import Grads, Operator
from rlk._runtime.signature import Signature, group_param, plain, temperature_param
from rlk._runtime.spec import GradCase, NativeKernel, OpSpec, Sample
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
    if validate.value_checks(flat_tokens):
        shards.check_tokens(flat_tokens, shards.layout(logits.shape[-1], group,
                                                       logits.device).total, ignore_index)
    args = {"logits": logits.reshape(-1, logits.shape[-1]), "tokens": flat_tokens,
            "temperature": temp, "ignore_index": ignore_index, "group": group,
            "with_entropy": with_entropy}
    return args, lead


def _flags(args: Mapping[str, Any]) -> tuple[Any, ...]:
    return args["with_entropy"], isinstance(args["temperature"], Tensor)


# ---------------------------------------------------------------------------
# torch operators


def _signature(with_entropy: bool) -> Signature:
    return Signature((plain("logits", "Tensor"), plain("tokens", "Tensor"), temperature_param(),
                      plain("ignore_index", "int"), group_param()),
                     fixed={"with_entropy": with_entropy})


def _backward(kernel: BoundKernel, args: Mapping[str, Any], grads: Grads,
              needs: tuple[bool, ...]) -> Grads:
    """The kernel's backward; an output without a gradient counts as zeros."""
    grad_logp, grad_entropy = grads[0], grads[1]
    entropy = args["entropy"]
    if grad_logp is None or (grad_entropy is None and entropy is not None):
        zeros = args["logits"].new_zeros(args["logits"].shape[0], dtype=torch.float32)
        grad_logp = zeros if grad_logp is None else grad_logp
        grad_entropy = zeros if grad_entropy is None and entropy is not None else grad_entropy
    return (kernel.backward(
        grad_logp.contiguous(), None if grad_entropy is None else grad_entropy.contiguous(),
        args["logits"], args["tokens"], args["temperature"], args["ignore_index"],
        args["group"], args["lse"], entropy,
    ),)


def _operator(with_entropy: bool) -> Operator:
    return Operator(_signature(with_entropy),
                    returns=("Tensor", "Tensor" if with_entropy else None, "Tensor"),
                    grad_inputs=("logits",), backward=_backward, detached_outputs=(2,),
                    saved_outputs=((1, "entropy"), (2, "lse")))


# ---------------------------------------------------------------------------
# public functions (rlk.distributed)


def _call(logits: Tensor, tokens: Tensor, group: Any, temperature: Temperature,
          ignore_index: int, with_entropy: bool) -> tuple[Tensor, Tensor | None]:
    args, shape = _prepare(logits, tokens, group, temperature, ignore_index, with_entropy)
    spec = DISTRIBUTED_LOGP_ENTROPY if with_entropy else DISTRIBUTED_LOGP
    result, entropy, _ = spec.call(args)
    return result.view(shape), (None if entropy is None else entropy.view(shape))


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
    result, entropy = _call(logits, tokens, group, temperature, ignore_index, True)
    assert entropy is not None
    return result, entropy


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
    logits = args["logits"].detach().clone().requires_grad_(True)
    op = (torch.ops.rlk.distributed_logp_entropy.default if args["with_entropy"]
          else torch.ops.rlk.distributed_logp.default)
    return op, _signature(args["with_entropy"]).encode(dict(args, logits=logits))


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
        operator=_operator(with_entropy),
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
