"""Checks of what a kernel did to values, beyond its outputs' metadata (rlk._runtime.contract):
its inputs are unchanged, no output shares memory with an input, and an output holds NaN only
where the op's contract allows one.

They read every input and output (a device sync, a pass over the logits), so they run under
RLK_CHECK_INPUTS=1 (`rlk.check_inputs(True)`) and in the conformance kit, not by default:
docs/backends/writing-a-backend.md gives their cost. A kernel may write only its `out`
buffers, and its `logits` when a backward is called in place (its last argument, `inplace`,
is True); only those outputs may share memory with an input.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from rlk.errors import KernelError
from rlk.registry import Kernel

# A fingerprint sums an input's bits as integers of its element size (wrapping in int64):
# any write that changes one element changes it, and it costs no copy of the input.
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

Named = Mapping[str, Any]
# (forward's arguments by name, its outputs) -> per output: where NaN is allowed (a bool
# tensor broadcasting to it, or one bool for all of it); None when the op states no rule
NanRule = Callable[[Named, tuple[Any, ...]], tuple["Tensor | bool", ...]]


def fingerprints(args: tuple[Any, ...], kwargs: Named) -> list[tuple[str, Tensor, Tensor]]:
    """(name, tensor, fingerprint) of every input tensor a kernel must leave unchanged."""
    found = []
    for name, value in _inputs(args, kwargs):
        if isinstance(value, Tensor) and value.numel() and not name.startswith("out"):
            found.append((name, value, _fingerprint(value)))
    return found


def verify(kernel: Kernel, phase: str, meta: Callable[..., Any] | None, args: tuple[Any, ...],
           kwargs: Named, result: Any, before: list[tuple[str, Tensor, Tensor]],
           rule: NanRule | None = None) -> None:
    """KernelError naming the backend if the call wrote an input, returned an alias of one,
    or (forwards) returned NaN where its op allows none (`rule`: the op's NaN rule)."""
    outputs = result if isinstance(result, tuple) else (result,)
    in_place = phase == "backward" and (kwargs.get("inplace") is True
                                        or (bool(args) and args[-1] is True))
    given_up = {_storage(o) for o in outputs if isinstance(o, Tensor)} if in_place else set()
    for name, value, fingerprint in before:
        if _storage(value) not in given_up and not torch.equal(_fingerprint(value), fingerprint):
            _broken(kernel, phase, f"wrote its input '{name}' (kernels write only their "
                                   "out= buffers, and logits in an in-place backward)")
    inputs = {_storage(v): name for name, v in _inputs(args, kwargs)
              if isinstance(v, Tensor) and v.numel() and not name.startswith("out")}
    for index, output in enumerate(outputs):
        if not isinstance(output, Tensor) or not output.numel() or in_place:
            continue
        aliased = inputs.get(_storage(output))
        if aliased is not None:
            _broken(kernel, phase, f"returned output {index} sharing memory with its input "
                                   f"'{aliased}' (return a new tensor, e.g. a .clone())")
    if phase == "forward" and rule is not None:
        named = _named(meta, args, kwargs)
        if named is not None:
            _check_nan(kernel, outputs, rule(named, outputs))


def _check_nan(kernel: Kernel, outputs: tuple[Any, ...],
               allowed: tuple[Tensor | bool, ...]) -> None:
    for index, (output, where) in enumerate(zip(outputs, allowed, strict=False)):
        if where is True or not isinstance(output, Tensor) or not output.is_floating_point():
            continue
        bad = output.isnan() if where is False else output.isnan() & ~where
        if bool(bad.any()):
            first = [int(i) for i in torch.nonzero(bad)[0]]
            _broken(kernel, "forward", f"returned NaN in output {index} at {first}, where the "
                                       "op's inputs give a number")


def _named(meta: Callable[..., Any] | None, args: tuple[Any, ...],
           kwargs: Named) -> dict[str, Any] | None:
    """The call's arguments by name (positional ones named by the op's output_meta), or None."""
    if not args:
        return dict(kwargs)
    if meta is None:
        return None
    try:
        return dict(inspect.signature(meta).bind(*args, **kwargs).arguments)
    except TypeError:
        return None


def _inputs(args: tuple[Any, ...], kwargs: Named) -> list[tuple[str, Any]]:
    return [*((f"argument {i}", v) for i, v in enumerate(args)), *kwargs.items()]


def _storage(tensor: Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _fingerprint(tensor: Tensor) -> Tensor:
    bits = tensor.detach()
    if bits.dtype == torch.bool:
        bits = bits.to(torch.uint8)
    return bits.view(_BITS[bits.element_size()]).sum(dtype=torch.int64)


def _broken(kernel: Kernel, phase: str, problem: str) -> None:
    raise KernelError(f"backend '{kernel.backend}' broke the '{kernel.op}' contract: its "
                      f"{phase} kernel {kernel.target} {problem}.")


# ---------------------------------------------------------------------------------------------
# helpers of the ops' NaN rules (each op's spec names its own: OpSpec.nan_rule)


def fine_rows(logits: Tensor, temperature: Any) -> Tensor:
    """Rows whose results are numbers: no NaN or +inf, not all -inf, a number temperature."""
    fine = ((~logits.isnan()) & (logits != math.inf)).all(dim=-1) & (logits > -math.inf).any(-1)
    if isinstance(temperature, Tensor):
        fine &= ~temperature.isnan()
    return fine


def selected(fine: Tensor, rows: Tensor | None) -> tuple[Tensor, Tensor | slice]:
    """`fine` at the computed rows (an index outside [0, M) is not fine), and the index."""
    if rows is None:
        return fine, slice(None)
    inside = (rows >= 0) & (rows < fine.shape[0])
    picked = torch.where(inside, rows, 0)
    return fine[picked] & inside, picked


def finite(*tensors: Any) -> bool:
    return all(bool(t.isfinite().all()) for t in tensors
               if isinstance(t, Tensor) and t.is_floating_point())


def finite_inputs_rule(named: Named, outputs: tuple[Any, ...]) -> tuple[Tensor | bool, ...]:
    """Ops whose NaN comes only from a NaN or infinite input, through the whole result."""
    return (not finite(*named.values()),) * len(outputs)
