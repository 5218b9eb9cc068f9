"""One call shape from every op to its kernel, eager and traced, and its torch operators.

An op declares an `Operator` once: its operator parameters (a `Signature`), what it returns,
which arguments are differentiable and its backward glue. From that, `define` registers the
op's torch operators in one style (`rlk::<op>`, and `rlk::<op>_backward` for an op with a
backward kernel) with their fakes and autograd, and `run` is the one path every public op
takes to its kernel:

- outside tracing, the selected kernel runs directly, under a plain autograd.Function when
  an input requires grad (torch.library's wrappers cost far more host time than a small
  op's kernels take on the GPU: about 1 ms against 20 us for policy_loss forward+backward);
- under torch.compile, export, fake tensors, dispatch modes, functorch transforms and jit
  tracing, the torch operator runs, so graphs hold one opaque node.

Both paths call the same `backward` and return the kernel's outputs in the same layout.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.autograd.forward_ad as forward_ad
from torch import Tensor
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from rlk._runtime.autograd_modes import no_double_backward, refuse_dual, refuse_transforms
from rlk._runtime.contract import BoundKernel
from rlk._runtime.signature import KernelArgs, Signature
from rlk.dispatch import Policy, ScopedPolicy, captured_policy

Grads = tuple[Tensor | None, ...]
# (kernel, kernel arguments with the saved outputs, output gradients, which grad_inputs need
# a gradient) -> a gradient (or None) per grad_input
Backward = Callable[[BoundKernel, Mapping[str, Any], Grads, tuple[bool, ...]], Grads]


@dataclass(frozen=True)
class Operator:
    """How an op crosses torch.library and autograd.

    - `signature`: the operator's parameters, from kernel arguments (see signature.py).
    - `returns`: the schema type of each kernel output, None for an output this op never
      produces (logp's entropy); a plain "Tensor" for a kernel returning one tensor.
    - `kernel_arguments`: the operator's arguments -> kernel arguments, when they differ
      (group_advantages' dense group ids; the linear ops' hidden cast to the GEMM dtype).
      It runs where the kernel does, inside autograd: the op saves the caller's tensors and
      returns each gradient in its input's dtype. Selection reads its output.
    - `bind_arguments`: (chosen kernel, kernel arguments) -> what that kernel takes, when
      kernels differ in it (the linear ops' float32 weight, rlk._runtime.head).
    - `grad_inputs`: kernel arguments that may require grad, in the order `backward`
      returns their gradients; `backward`: the backward glue (see `Backward`), written once
      and run by both paths.
    - `saved_outputs`: (output position, name) of outputs the backward reads (logp's lse),
      handed to `backward` among the kernel arguments under `name`.
    - `detached_outputs`: positions of outputs that carry no gradient (metrics).
    - `grad_outputs`: for an op whose forward computes its gradients (linear_policy_loss),
      the positions of those outputs, in `grad_inputs` order: the backward scales them by
      the upstream gradient; `run` does not return them.
    - `forward_with_grads`: (kernel, detached kernel arguments) -> (outputs, state) when the
      kernel computes the input gradients in its forward (one call instead of two), else
      None; `backward_from`: (state, output gradients) -> the input gradients. The eager
      path's fused form: nothing is saved but `state`, and no kernel is dispatched again.
    - `without_autocast`: the kernels run with autocast off (the linear ops pick their
      GEMMs' dtypes themselves).
    """

    signature: Signature
    returns: str | tuple[str | None, ...]
    kernel_arguments: Callable[[KernelArgs], KernelArgs] | None = None
    bind_arguments: Callable[[BoundKernel, KernelArgs], KernelArgs] | None = None
    grad_inputs: tuple[str, ...] = ()
    backward: Backward | None = None
    saved_outputs: tuple[tuple[int, str], ...] = ()
    detached_outputs: tuple[int, ...] = ()
    grad_outputs: tuple[int, ...] = ()
    forward_with_grads: Callable[[BoundKernel, KernelArgs], tuple[Any, Any] | None] | None = None
    backward_from: Callable[[Any, Grads], Grads] | None = None
    without_autocast: bool = False

    @property
    def single(self) -> bool:
        return isinstance(self.returns, str)

    def produced(self) -> tuple[int, ...]:
        """Kernel output positions the torch operator returns."""
        if isinstance(self.returns, str):
            return (0,)
        return tuple(i for i, kind in enumerate(self.returns) if kind is not None)

    def selection_arguments(self, args: KernelArgs) -> KernelArgs:
        """The caller's arguments as selection reads them (`kernel_arguments`)."""
        return args if self.kernel_arguments is None else self.kernel_arguments(args)

    def bound(self, kernel: BoundKernel, args: KernelArgs) -> KernelArgs:
        """Selection's arguments as the chosen `kernel` takes them (`bind_arguments`)."""
        return args if self.bind_arguments is None else self.bind_arguments(kernel, args)


def define(spec: Any) -> Any:
    """Register `spec`'s torch operators (forward, and backward when it has one) with their
    fakes and autograd; returns the forward operator."""
    operator: Operator = spec.operator
    produced = operator.produced()
    returns = (operator.returns if isinstance(operator.returns, str) else
               "(" + ", ".join(operator.returns[i] for i in produced) + ")")  # type: ignore[misc]

    def forward(*values: Any) -> Any:
        given = operator.signature.decode(values)
        args = operator.selection_arguments(given)
        with _autocast_off(operator, args[spec.main_input].device):
            kernel = spec.kernel(args)
            result = kernel.forward(**operator.bound(kernel, args))
        if operator.grad_outputs:
            result = _grads_in_input_dtypes(operator, result, given, spec.main_input)
        return _operator_outputs(operator, result, produced)

    def fake(*values: Any) -> Any:
        metas = spec.output_meta(**operator.signature.decode(values))
        made = tuple(None if meta is None else torch.empty(meta.shape, dtype=meta.dtype,
                                                           device=meta.device)
                     for meta in metas)
        return made[0] if operator.single else _operator_outputs(operator, made, produced)

    op = torch.library.custom_op(f"rlk::{spec.name}", forward, mutates_args=(),
                                 schema=operator.signature.schema(returns))
    op.register_fake(fake)
    if operator.grad_outputs:
        _register_scaling(op, operator, spec.name)
    elif operator.backward is not None:
        _register_backward(spec, op, _backward_operator(spec), produced)
    return op


def _operator_outputs(operator: Operator, result: Any, produced: tuple[int, ...]) -> Any:
    """A kernel's outputs as the operator returns them: a schema of one output returns the
    tensor itself."""
    if operator.single:
        return result
    if len(produced) == 1:
        return result[produced[0]]
    return tuple(result[i] for i in produced)


def _as(grad: Tensor, given: Tensor | None) -> Tensor:
    """A gradient in its input's dtype (kernels may give float32 for a reduced input)."""
    if given is None or grad.dtype == given.dtype:
        return grad
    return grad.to(given.dtype)


def _grads_in_input_dtypes(operator: Operator, result: Any, given: Mapping[str, Any],
                           main_input: str) -> tuple[Any, ...]:
    """An operator's gradient outputs in their inputs' dtypes; an empty one (not asked for)
    in the main input's, as the fake gives it."""
    outputs = list(result)
    main = given[main_input]
    for position, name in zip(operator.grad_outputs, operator.grad_inputs, strict=True):
        grad = outputs[position]
        outputs[position] = _as(grad, given[name] if grad.numel() else main)
    return tuple(outputs)


def _autocast_off(operator: Operator,
                  device: torch.device) -> contextlib.AbstractContextManager[object]:
    if not operator.without_autocast:
        return contextlib.nullcontext()
    try:
        enabled = torch.is_autocast_enabled(device.type)
    except RuntimeError:  # a device type autocast does not know (meta)
        enabled = False
    return torch.autocast(device.type, enabled=False) if enabled else contextlib.nullcontext()


def _backward_operator(spec: Any) -> Any:
    """`rlk::<op>_backward`: the output gradients, the forward's arguments, the saved
    outputs and which inputs need a gradient -> a gradient per grad_input (empty where
    none is wanted)."""
    operator: Operator = spec.operator
    signature = operator.signature
    positions = [signature.position(name) for name in operator.grad_inputs]
    schema = signature.schema("Tensor[]").replace(
        "(", "(Tensor?[] grads, ", 1).replace(") ->", ", Tensor?[] saved, bool[] needs) ->")

    def backward(grads: list[Tensor | None], *rest: Any) -> list[Tensor]:
        *values, saved, needs = rest
        args = dict(operator.selection_arguments(signature.decode(values)))
        for (_, name), value in zip(operator.saved_outputs, saved, strict=True):
            args[name] = value
        assert operator.backward is not None
        with _autocast_off(operator, args[spec.main_input].device):
            kernel = spec.kernel(args)
            found = operator.backward(kernel, operator.bound(kernel, args), tuple(grads),
                                      tuple(needs))
        anchor = next(v for v in values if isinstance(v, Tensor))
        return [anchor.new_empty(0) if grad is None else _as(grad, values[pos])
                for grad, pos in zip(found, positions, strict=True)]

    def fake(grads: list[Tensor | None], *rest: Any) -> list[Tensor]:
        values = rest[:-2]
        anchor = next(v for v in values if isinstance(v, Tensor))
        return [anchor.new_empty(0) if values[pos] is None else torch.empty_like(values[pos])
                for pos in positions]

    def refuse(ctx: Any, *grads: Any) -> Any:
        raise RuntimeError(no_double_backward(spec.name))

    op = torch.library.custom_op(f"rlk::{spec.name}_backward", backward, mutates_args=(),
                                 schema=schema)
    op.register_fake(fake)
    # differentiating a gradient again reaches this node (its inputs are the op's): the
    # refusal names the op, as on the eager path
    op.register_autograd(refuse, setup_context=lambda ctx, inputs, output: None)
    return op


def _register_backward(spec: Any, op: Any, backward_op: Any, produced: tuple[int, ...]) -> None:
    """Autograd of the forward operator: save its tensor arguments and the outputs the
    backward reads, and run the backward operator under the forward's backend policy."""
    operator: Operator = spec.operator
    signature = operator.signature
    width = len(signature.parameters)
    tensors = [i for i, part in enumerate(signature.parameters) if part.startswith("Tensor")]
    positions = [signature.position(name) for name in operator.grad_inputs]
    # where each saved output sits among the operator's outputs (None: never produced)
    saved_at = [produced.index(i) if i in produced else None for i, _ in operator.saved_outputs]
    layout = (1 if operator.single else len(operator.returns))

    def setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        outputs = output if isinstance(output, tuple) else (output,)
        ctx.rlk_policy = captured_policy()
        ctx.save_for_backward(*(inputs[i] for i in tensors),
                              *(None if i is None else outputs[i] for i in saved_at))
        ctx.values = [None if i in tensors else value for i, value in enumerate(inputs)]

    def grad(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        saved = ctx.saved_tensors
        values = list(ctx.values)
        for i, value in zip(tensors, saved, strict=False):
            values[i] = value
        aligned: list[Tensor | None] = [None] * layout
        for position, value in zip(produced, grads, strict=True):
            aligned[position] = value
        needs = [bool(ctx.needs_input_grad[pos]) for pos in positions]
        with ScopedPolicy(ctx.rlk_policy):
            found = backward_op(aligned, *values, list(saved[len(tensors):]), needs)
        result: list[Tensor | None] = [None] * width
        for pos, need, value in zip(positions, needs, found, strict=True):
            result[pos] = value if need and values[pos] is not None else None
        return tuple(result)

    op.register_autograd(grad, setup_context=setup)


def _register_scaling(op: Any, operator: Operator, name: str) -> None:
    """Autograd of an operator returning its own gradients: they are scaled by the upstream
    gradient of its first output (out of place: they are the operator's outputs)."""
    positions = [operator.signature.position(name) for name in operator.grad_inputs]
    width = len(operator.signature.parameters)

    def setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
        ctx.save_for_backward(*(output[i] for i in operator.grad_outputs))
        ctx.set_materialize_grads(False)
        ctx.rlk_name = name

    def grad(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        # the gradient outputs get an upstream gradient only when a gradient (saved * g)
        # is differentiated again: their own derivative is not known
        if any(grads[i] is not None for i in operator.grad_outputs):
            raise RuntimeError(no_double_backward(ctx.rlk_name))
        grad_first = grads[0]
        result: list[Tensor | None] = [None] * width
        if grad_first is None:
            return tuple(result)
        for pos, saved in zip(positions, ctx.saved_tensors, strict=True):
            if ctx.needs_input_grad[pos]:
                result[pos] = saved * grad_first
        return tuple(result)

    op.register_autograd(grad, setup_context=setup)


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


def run(spec: Any, args: KernelArgs) -> Any:
    """Run an op on its validated kernel arguments (see the module docstring); returns the
    kernel's outputs (less `grad_outputs`)."""
    operator: Operator = spec.operator
    compiling = torch.compiler.is_compiling()  # dynamo cannot trace the checks below
    if forward_ad._current_level >= 0 and not compiling:  # inside a dual_level
        refuse_dual(spec.name, args)
    if traced(args):
        if not compiling:
            refuse_transforms(spec.name)
        result = spec.torch_op(*operator.signature.encode(args))
        return _as_kernel_outputs(operator, result)
    kernel_args = operator.selection_arguments(args)
    kernel = spec.kernel(kernel_args)
    if operator.without_autocast:
        with _autocast_off(operator, kernel_args[spec.main_input].device):
            return _run_kernel(spec, operator, kernel, args, kernel_args)
    return _run_kernel(spec, operator, kernel, args, kernel_args)


def _run_kernel(spec: Any, operator: Operator, kernel: BoundKernel, args: KernelArgs,
                kernel_args: KernelArgs) -> Any:
    """The eager path: the kernel itself, under autograd when an input requires grad (which
    gets the caller's tensors, `args`, and runs `kernel_arguments` itself)."""
    if torch.is_grad_enabled():
        for name in operator.grad_inputs:
            value = args[name]
            if value is not None and value.requires_grad:
                call = _Call(operator, kernel, args, captured_policy(),
                             kernel_args[spec.main_input].device)
                return _apply(call, *(args[name] for name in operator.grad_inputs))
    result = kernel.forward(**operator.bound(kernel, kernel_args))
    return result if not operator.grad_outputs else _visible(operator, result)


def _as_kernel_outputs(operator: Operator, result: Any) -> Any:
    """The torch operator's outputs in the kernel's layout (None where the op produces no
    output), less `grad_outputs`."""
    if operator.single:
        return result
    produced = operator.produced()
    if len(produced) == 1:
        result = (result,)
    full: list[Any] = [None] * len(operator.returns)
    for position, value in zip(produced, result, strict=True):
        full[position] = value
    return _visible(operator, tuple(full))


def _visible(operator: Operator, result: Any) -> Any:
    if not operator.grad_outputs:
        return result
    return tuple(v for i, v in enumerate(result) if i not in operator.grad_outputs)


class _Call:
    """One eager call: what its backward needs besides the saved tensors."""

    __slots__ = ("args", "device", "dtypes", "kernel", "names", "operator", "policy", "state")

    def __init__(self, operator: Operator, kernel: BoundKernel, args: KernelArgs,
                 policy: Policy | None, device: torch.device):
        self.operator, self.kernel, self.args, self.policy = operator, kernel, args, policy
        self.device = device  # the main input's: autocast stays off there in the backward
        self.names: tuple[str, ...] = ()
        self.dtypes: tuple[torch.dtype | None, ...] = ()  # of the grad inputs, as given
        self.state: Any = None  # what forward_with_grads left for backward_from


class _KernelFunction(torch.autograd.Function):
    """The selected kernel under plain autograd (the eager path of `run`).

    The tensor arguments are saved with save_for_backward, so an in-place change between
    forward and backward raises as it does for any torch op; the kernel sees them detached.
    A kernel that computes the gradients in its forward (Operator.forward_with_grads) needs
    none of them: only its gradients are kept, and the backward scales them.
    """

    @staticmethod
    def forward(ctx: Any, call: _Call, *inputs: Tensor | None) -> Any:
        operator = call.operator
        args = dict(call.args)
        given = dict(call.args)
        for name in operator.grad_inputs:
            value = args[name]
            if value is not None:
                args[name] = value.detach()
        call.dtypes = tuple(None if value is None else value.dtype for value in inputs)
        kernel_args = operator.bound(call.kernel, operator.selection_arguments(args))
        fused = operator.forward_with_grads
        done = None if fused is None else fused(call.kernel, kernel_args)
        if done is not None:
            outputs, call.state = done
            call.args = {}
        else:
            outputs = call.kernel.forward(**kernel_args)
            if operator.grad_outputs:
                outputs = _visible(operator, outputs)
            names, tensors = [], []
            for name, value in args.items():
                if isinstance(value, Tensor):
                    names.append(name)
                    # the caller's grad inputs, attached: a create_graph backward ties its
                    # refusal to them (_backward_refusing_double)
                    tensors.append(given[name] if name in operator.grad_inputs else value)
            for name in names:
                args[name] = None  # the tensors live in saved_tensors only
            for index, name in operator.saved_outputs:
                names.append(name)
                tensors.append(outputs[index])
            ctx.save_for_backward(*tensors)
            call.names, call.args = tuple(names), args
        ctx.call = call
        for index in operator.detached_outputs:
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
    operator = call.operator
    if call.state is not None:
        assert operator.backward_from is not None
        return (None, *_in_dtypes(operator.backward_from(call.state, grads), call.dtypes))
    assert operator.backward is not None
    args = dict(call.args)
    for name, value in zip(call.names, ctx.saved_tensors, strict=True):
        args[name] = value.detach() if value is not None else None
    args = operator.bound(call.kernel, operator.selection_arguments(args))
    with ScopedPolicy(call.policy), _autocast_off(operator, call.device):
        found = operator.backward(call.kernel, args, grads, ctx.needs_input_grad[1:])
    return (None, *_in_dtypes(found, call.dtypes))


def _in_dtypes(grads: Grads, dtypes: tuple[torch.dtype | None, ...]) -> Grads:
    """Gradients in their inputs' dtypes (kernels may give float32 for a reduced input)."""
    return tuple(grad if grad is None or dtype is None or grad.dtype == dtype
                 else grad.to(dtype) for grad, dtype in zip(grads, dtypes, strict=True))


def _backward_refusing_double(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
    """The backward under create_graph=True: kernels have no double backward, so the
    gradients come back from a node that raises when they are differentiated.

    The node takes the op's inputs too, so that differentiating a gradient with respect to
    anything upstream of them runs it (a node tied only to detached gradients was skipped,
    and the second-order term silently dropped next to other differentiable terms). An op
    whose kernel computed its gradients in the forward saved no inputs to tie them to: it
    raises at once. Unlike once_differentiable, which refuses only when an upstream
    gradient requires grad, this never passes a gradient that depends on the inputs as a
    constant.
    """
    call: _Call = ctx.call
    operator = call.operator
    name = call.kernel.kernel.op
    if call.state is not None:
        raise RuntimeError(no_double_backward(name) + "; it computes its gradients in the "
                           "forward, so a create_graph=True backward through it is refused")
    with torch.no_grad():
        outputs = _backward(ctx, *grads)
    inputs = [value for key, value in zip(call.names, ctx.saved_tensors, strict=True)
              if key in operator.grad_inputs and value is not None and value.requires_grad]
    refuse: Any = torch._C._functions.DelayedError(no_double_backward(name).encode(),
                                                   len(outputs) + len(inputs))
    tied = refuse(*(None if grad is None else grad.detach().requires_grad_(True)
                    for grad in outputs), *inputs)
    return tuple(tied[:len(outputs)])


# Function.apply's Python layer unwraps functorch wrappers and binds defaults; a call that
# reaches the eager path has neither (functorch transforms take the torch operator).
_apply = super(torch.autograd.Function, _KernelFunction).apply
