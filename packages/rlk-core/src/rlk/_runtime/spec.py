"""The declaration every operator makes once, and the dispatch step all ops share."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from rlk._runtime.contract import BoundKernel, MetaFn
from rlk.dispatch import (
    Policy,
    ScopedPolicy,
    Selection,
    captured_policy,
    current_policy,
    get_dispatcher,
)
from rlk.op_table import SPECS
from rlk.registry import Kernel, resolve

KernelArgs = dict[str, Any]
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
class EagerPath:
    """How an op runs its kernels directly when nothing traces the call.

    torch.library's wrappers cost far more host time than a small op's kernels take on
    the GPU (about 1 ms against 20 us for policy_loss forward+backward). Outside
    torch.compile, export and other tracing, an op with an EagerPath calls the selected
    kernel itself, under a plain autograd.Function when an input requires grad; under
    them, `torch_op` runs, so compiled and exported graphs still hold one opaque node.

    - `torch_op`: the op's torch operator; `op_arguments`: the op's validated arguments
      -> its positional arguments; `kernel_arguments`: the same -> kernel arguments, when
      they differ (what the torch operator's implementation does first).
    - `grad_inputs`: kernel arguments that may require grad, in the order `backward`
      returns their gradients; `backward`: (kernel, kernel arguments, output gradients)
      -> those gradients.
    - `detached_outputs`: positions of outputs that carry no gradient (metrics).
    - `saved_outputs`: (position, name) of outputs the backward reads (logp's lse): saved
      beside the input tensors and handed to `backward` among its arguments under `name`.
    - `forward_with_grads`: (kernel, detached kernel arguments) -> (outputs, state) when the
      kernel can compute the input gradients in its forward (one call instead of two), else
      None; `backward_from`: (state, output gradients) -> the input gradients. Nothing is
      saved for the backward but `state`, and it dispatches no kernel.
    """

    torch_op: Callable[..., Any]
    op_arguments: Callable[[Mapping[str, Any]], tuple[Any, ...]]
    kernel_arguments: Callable[[Mapping[str, Any]], KernelArgs] | None = None
    grad_inputs: tuple[str, ...] = ()
    backward: Callable[[BoundKernel, Mapping[str, Any], tuple[Tensor | None, ...]],
                       tuple[Tensor | None, ...]] | None = None
    detached_outputs: tuple[int, ...] = ()
    saved_outputs: tuple[tuple[int, str], ...] = ()
    forward_with_grads: Callable[[BoundKernel, KernelArgs], tuple[Any, Any] | None] | None = None
    backward_from: Callable[[Any, tuple[Tensor | None, ...]],
                            tuple[Tensor | None, ...]] | None = None


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
    - `eager`: how the op runs its kernels directly when nothing traces the call.
    - `native`: the built-in backend's kernel (registered by rlk.native).
    - `output_meta` / `grad_meta`: called with a forward / backward kernel call's own
      arguments, what each tensor it returns must be (`Out`, or None: unchecked); every
      call is checked against them (see rlk._runtime.contract).
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
    eager: EagerPath | None = None
    doc: str = ""
    native: NativeKernel | None = None
    output_meta: MetaFn | None = None
    grad_meta: MetaFn | None = None
    shape_call: ShapeCall | None = None
    shape_help: str = ""

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
        return BoundKernel(kernel, self.output_meta, self.grad_meta)

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
        """Run the op on its validated arguments: directly when nothing traces the call
        (see EagerPath), else through its torch operator."""
        eager = self.eager
        assert eager is not None, f"op {self.name} declares no EagerPath"
        if traced(args):
            return eager.torch_op(*eager.op_arguments(args))
        if eager.kernel_arguments is not None:
            args = eager.kernel_arguments(args)
        kernel = self.kernel(args)
        if torch.is_grad_enabled():
            for name in eager.grad_inputs:
                value = args[name]
                if value is not None and value.requires_grad:
                    call = _Call(eager, kernel, args, captured_policy())
                    return _apply(call, *(args[name] for name in eager.grad_inputs))
        return kernel.forward(**args)


_PLAIN_TENSORS = (Tensor, torch.nn.Parameter)
_is_tracing = torch._C._get_tracing_state  # torch.jit.is_tracing without its Python layer


def traced(args: Mapping[str, Any]) -> bool:
    """Whether something records or transforms this call (compile, export, fake tensors,
    dispatch modes, vmap/grad transforms, jit tracing, tensor subclasses): then the torch
    operator must run so that it sees one op."""
    if (torch.compiler.is_compiling() or is_in_torch_dispatch_mode()
            or torch._C._functorch.peek_interpreter_stack() is not None
            or _is_tracing() is not None):
        return True
    for value in args.values():  # a loop: any(...) costs 3x on every call
        if isinstance(value, Tensor) and type(value) not in _PLAIN_TENSORS:
            return True
    return False


class _Call:
    """One eager call: what its backward needs besides the saved tensors."""

    __slots__ = ("args", "eager", "kernel", "names", "policy", "state")

    def __init__(self, eager: EagerPath, kernel: BoundKernel, args: KernelArgs,
                 policy: Policy | None):
        self.eager, self.kernel, self.args, self.policy = eager, kernel, args, policy
        self.names: tuple[str, ...] = ()
        self.state: Any = None  # what forward_with_grads left for backward_from


class _KernelFunction(torch.autograd.Function):
    """The selected kernel under plain autograd (the eager path of an op with an EagerPath).

    The tensor arguments are saved with save_for_backward, so an in-place change between
    forward and backward raises as it does for any torch op; the kernel sees them detached.
    A kernel that computes the gradients in its forward (EagerPath.forward_with_grads) needs
    none of them: only its gradients are kept, and the backward scales them.
    """

    @staticmethod
    def forward(ctx: Any, call: _Call, *inputs: Tensor | None) -> Any:
        eager = call.eager
        args = dict(call.args)
        for name in eager.grad_inputs:
            value = args[name]
            if value is not None:
                args[name] = value.detach()
        fused = eager.forward_with_grads
        done = None if fused is None else fused(call.kernel, args)
        if done is not None:
            outputs, call.state = done
            call.args = {}
        else:
            outputs = call.kernel.forward(**args)
            names, tensors = [], []
            for name, value in args.items():
                if isinstance(value, Tensor):
                    names.append(name)
                    tensors.append(value)
            for name in names:
                args[name] = None  # the tensors live in saved_tensors only
            for index, name in eager.saved_outputs:
                names.append(name)
                tensors.append(outputs[index])
            ctx.save_for_backward(*tensors)
            call.names, call.args = tuple(names), args
        ctx.call = call
        for index in eager.detached_outputs:
            ctx.mark_non_differentiable(outputs[index])
        ctx.set_materialize_grads(False)
        return outputs

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> Any:
        if torch.is_grad_enabled():  # create_graph=True
            return _backward_refusing_double(ctx, *grads)
        return _backward(ctx, *grads)


def _backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
    call: _Call = ctx.call
    eager = call.eager
    if call.state is not None:
        assert eager.backward_from is not None
        return (None, *eager.backward_from(call.state, grads))
    assert eager.backward is not None
    args = dict(call.args)
    for name, value in zip(call.names, ctx.saved_tensors, strict=True):
        args[name] = value
    with ScopedPolicy(call.policy):
        return (None, *eager.backward(call.kernel, args, grads))


def _backward_refusing_double(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
    """The backward under create_graph=True: kernels have no double backward, so the
    gradients come back attached to a node that raises when they are differentiated.

    Always, unlike once_differentiable, which does so only when an upstream gradient
    requires grad: the gradients depend on the saved inputs, so a gradient taken as a
    constant would make second-order terms silently wrong.
    """
    with torch.no_grad():
        outputs = _backward(ctx, *grads)
    op = ctx.call.kernel.kernel.op
    refuse: Any = torch._C._functions.DelayedError(
        f"rlk.{op} has no double backward: its kernels' gradient is not differentiable "
        "(create_graph=True gives a gradient that cannot be differentiated again)".encode(),
        len(outputs))
    return refuse(*(None if grad is None else grad.detach().requires_grad_(True)
                    for grad in outputs))
# Function.apply's Python layer unwraps functorch wrappers and binds defaults; a call that
# reaches the eager path has neither (functorch transforms take the torch operator).
_apply = super(torch.autograd.Function, _KernelFunction).apply


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
        with ScopedPolicy(ctx.rlk_policy):
            return backward(ctx, *grads)

    if isinstance(op, str):
        torch.library.register_autograd(op, grad, setup_context=setup)
    else:
        op.register_autograd(grad, setup_context=setup)


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
