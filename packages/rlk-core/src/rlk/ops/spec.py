"""The declaration every operator makes once, and the dispatch step all ops share."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rlk.dispatch import captured_policy, get_dispatcher, scoped_policy
from rlk.registry import Kernel

KernelArgs = dict[str, Any]
GradCase = tuple[str, Tensor, Tensor]


@dataclass(frozen=True)
class Tolerance:
    """Allowed distance from the float64 reference: |out - ref| <= atol + rtol * |ref|."""

    atol: float
    rtol: float


@dataclass(frozen=True)
class Sample:
    """One conformance case: kernel-level arguments and whether to check its backward."""

    name: str
    args: KernelArgs
    check_backward: bool = True


@dataclass(frozen=True)
class OpSpec:
    """Everything core knows about one operator; the conformance kit reads only this.

    - `main_input`: the kernel argument whose device and dtype drive selection.
    - `prepare`: the public function's arguments -> validated kernel arguments.
    - `flags`: the rest of the selection cache key, from kernel arguments.
    - `reference`: kernel arguments -> float64 truth, a tuple aligned with `outputs`.
    - `outputs`: (kernel result, kernel arguments) -> the tensors compared with it.
    - `samples`: the conformance cases for a device and dtype of the main input.
    - `grad_check`: (kernel, arguments, generator) -> (name, actual, float64 expected)
      triples for the backward, or None for ops without one.
    - `opcheck_case`: kernel arguments -> (torch op overload, its arguments) for
      torch.library.opcheck.
    - `batch_slice`: kernel arguments restricted to rows [start, stop), or None where
      batch invariance has no meaning for these arguments.
    """

    name: str
    main_input: str
    prepare: Callable[..., KernelArgs]
    flags: Callable[[Mapping[str, Any]], tuple[Any, ...]]
    reference: Callable[[Mapping[str, Any]], tuple[Tensor, ...]]
    outputs: Callable[[Any, Mapping[str, Any]], tuple[Tensor, ...]]
    samples: Callable[[torch.device, torch.dtype], Iterator[Sample]]
    tolerances: Mapping[torch.dtype, Tolerance]
    dtypes: tuple[torch.dtype, ...]
    opcheck_case: Callable[[KernelArgs], tuple[Any, tuple[Any, ...]]]
    grad_check: Callable[[Kernel, KernelArgs, torch.Generator], Iterator[GradCase]] | None = None
    grad_tolerances: Mapping[torch.dtype, Tolerance] | None = None
    batch_slice: Callable[[KernelArgs, int, int], KernelArgs | None] | None = None
    doc: str = ""

    def kernel(self, args: Mapping[str, Any]) -> Kernel:
        """The selected backend's kernel for these kernel-level arguments."""
        main = args[self.main_input]
        flags = self.flags(args)
        return get_dispatcher().kernel_for(self.name, main.device, main.dtype, flags, args)


def register_autograd(op: Any, backward: Callable[..., Any],
                      setup_context: Callable[..., None]) -> None:
    """`op.register_autograd` (`op` a custom_op, or the qualified name of a defined one), with
    the backward selecting its kernels under the backend policy of the forward: a
    `use_backends(...)` scope around the forward covers the backward too, even when
    `.backward()` runs outside it (or on autograd's own thread)."""

    def setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.rlk_policy = captured_policy()
        setup_context(ctx, inputs, output)

    def grad(ctx: Any, *grads: Any) -> Any:
        with scoped_policy(ctx.rlk_policy):
            return backward(ctx, *grads)

    if isinstance(op, str):
        torch.library.register_autograd(op, grad, setup_context=setup)
    else:
        op.register_autograd(grad, setup_context=setup)
