"""The declaration every operator makes once, and the dispatch step all ops share."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from rlk._runtime.contract import BoundKernel, MetaFn
from rlk._runtime.kernel_checks import NanRule
from rlk._runtime.operator import Operator, define, run
from rlk._runtime.signature import KernelArgs
from rlk.dispatch import Selection, current_policy, get_dispatcher
from rlk.op_table import SPECS
from rlk.registry import Kernel, resolve

GradCase = tuple[str, Tensor, Tensor]
# --shape sizes and a dtype -> (args, kwargs) of the public function, on the meta device
ShapeCall = Callable[[Sequence[int], torch.dtype], tuple[tuple[Any, ...], dict[str, Any]]]


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
class NativeKernel:
    """The built-in backend's kernel for an op ("module:function" targets), and the ops it
    dispatches itself (explain and doctor show which backend serves those)."""

    forward: str
    backward: str | None = None
    uses: tuple[str, ...] = ()


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
    - `operator`: how the op crosses torch.library and autograd (rlk._runtime.operator);
      building the spec registers its torch operators, `torch.ops.rlk.<name>`.
    - `native`: the built-in backend's kernel (registered by rlk.native).
    - `output_meta` / `grad_meta`: called with a forward / backward kernel call's own
      arguments, what each tensor it returns must be (`Out`, or None: unchecked); every
      call is checked against them (see rlk._runtime.contract).
    - `nan_rule`: (a forward call's named arguments, its outputs) -> where each output may
      hold NaN (a bool or a mask per output): what the value checks (RLK_CHECK_INPUTS=1, the
      kit, doctor --smoke) hold a kernel to; None: not checked.
    - `shape_call` / `shape_help`: the public call `rlk-core explain OP --shape ...`
      explains, built on the meta device, and the shape it takes ("N,V").
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
    grad_check: Callable[[BoundKernel, KernelArgs, torch.Generator],
                         Iterator[GradCase]] | None = None
    grad_tolerances: Mapping[torch.dtype, Tolerance] | None = None
    batch_slice: Callable[[KernelArgs, int, int], KernelArgs | None] | None = None
    operator: Operator | None = None
    doc: str = ""
    native: NativeKernel | None = None
    output_meta: MetaFn | None = None
    grad_meta: MetaFn | None = None
    shape_call: ShapeCall | None = None
    shape_help: str = ""
    nan_rule: NanRule | None = None
    torch_op: Any = field(init=False, default=None, repr=False, compare=False)

    @property
    def differentiable(self) -> bool:
        return self.grad_check is not None

    @property
    def backward_kernel(self) -> bool:
        """Whether the op's backward runs a kernel's backward (it does not for an op whose
        forward returns its gradients, as linear_policy_loss's does)."""
        return (self.grad_check is not None and self.native is not None
                and self.native.backward is not None)

    def kernel(self, args: Mapping[str, Any]) -> BoundKernel:
        """The selected backend's kernel for these kernel-level arguments."""
        main = args[self.main_input]
        return get_dispatcher().kernel_for(self.name, main.device, main.dtype, self.flags(args),
                                           args, self.needs_grad(args), self.bind)

    def select(self, args: Mapping[str, Any]) -> Selection:
        """The selection for these kernel-level arguments, with every rejection (explain)."""
        main = args[self.main_input]
        dispatcher = get_dispatcher()
        dispatcher.loader.ensure_loaded()
        return dispatcher.decide(self.name, main.device, main.dtype, args,
                                 current_policy(dispatcher), self.needs_grad(args))

    def bind(self, kernel: Kernel) -> BoundKernel:
        """`kernel` with this op's output contract attached."""
        return BoundKernel(kernel, self.output_meta, self.grad_meta, nan_rule=self.nan_rule)

    def needs_grad(self, args: Mapping[str, Any]) -> bool:
        """Whether the call needs a kernel with a backward: an input tensor requires grad.

        Metadata only, the same inside the torch op as in `explain`. Inside
        torch.compile tensors do not carry requires_grad, so there a kernel without a
        backward can be chosen and fails, naming the way around, at `.backward()`.
        """
        if not self.backward_kernel:
            return False
        for value in args.values():  # noqa: SIM110 - a loop: any(...) costs 3x on every call
            if isinstance(value, Tensor) and value.requires_grad:
                return True
        return False

    def call(self, args: KernelArgs) -> Any:
        """Run the op on its validated kernel arguments: its kernel directly when nothing
        traces the call, else its torch operator (rlk._runtime.operator)."""
        return run(self, args)

    def __post_init__(self) -> None:
        if self.operator is not None:
            object.__setattr__(self, "torch_op", define(self))


def specs() -> dict[str, OpSpec]:
    """Every op's spec, by name, in the op table's order (importing an op's module registers
    its torch ops)."""
    return dict(_specs())


@functools.cache
def _specs() -> dict[str, OpSpec]:
    found = {}
    for name, target in SPECS.items():
        spec = resolve(target)
        if spec.name != name:
            raise RuntimeError(f"rlk.op_table.SPECS maps '{name}' to {target}, whose name is "
                               f"'{spec.name}'")
        found[name] = spec
    return found
