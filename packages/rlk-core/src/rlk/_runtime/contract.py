"""The boundary between an op and the backend kernel serving it.

What a kernel returns is checked against what the op's spec says it returns, by metadata
only (type, shape, dtype, device: a few attribute reads per call): a float64 or
wrong-shape result, or None, fails here with the backend's name instead of passing as
silently wrong numbers. An exception a kernel raises keeps its type (an out-of-memory
error stays one) and gains a note naming the backend that raised and the way around it,
also when the kernel ran nested inside another (native `linear_logp` calling the `logp`
kernel of a third-party backend).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from rlk._runtime import kernel_checks
from rlk._runtime.validate import readable
from rlk.config import checking_inputs
from rlk.errors import KernelError
from rlk.registry import Kernel


class Out(NamedTuple):
    """What one tensor a kernel returns must be (`dtype`, or one of `alternatives`)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    alternatives: tuple[torch.dtype, ...] = ()


# The outputs a kernel call must return, from that call's own arguments; None: not checked.
MetaFn = Callable[..., tuple["Out | None", ...]]

_NOTE = "rlk:"


class BoundKernel:
    """A selected kernel with its op's contract attached (what dispatch hands to ops).

    Every call's outputs are checked by metadata; under RLK_CHECK_INPUTS=1, or with
    `verify_values=True` (the conformance kit), also by value (rlk._runtime.kernel_checks).
    """

    __slots__ = ("_grad_meta", "_nan_rule", "_output_meta", "kernel", "verify_values")

    def __init__(self, kernel: Kernel, output_meta: MetaFn | None, grad_meta: MetaFn | None,
                 verify_values: bool = False, nan_rule: kernel_checks.NanRule | None = None):
        self.kernel = kernel
        self._output_meta = output_meta
        self._grad_meta = grad_meta
        self.verify_values = verify_values
        self._nan_rule = nan_rule

    @property
    def backend(self) -> str:
        return self.kernel.backend

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._run("forward", self.kernel.forward, self._output_meta, args, kwargs)

    def backward(self, *args: Any, **kwargs: Any) -> Any:
        return self._run("backward", self.kernel.backward, self._grad_meta, args, kwargs)

    def _run(self, phase: str, function: Callable[..., Any], meta: MetaFn | None,
             args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        values = ((self.verify_values or checking_inputs())
                  and readable(*args, *kwargs.values()))
        before = kernel_checks.fingerprints(args, kwargs) if values else []
        try:
            result = function(*args, **kwargs)
        except Exception as exc:
            attribute(exc, self.kernel, phase)
            raise
        if meta is not None:
            check(self.kernel, phase, result, meta(*args, **kwargs))
        if values:
            kernel_checks.verify(self.kernel, phase, meta, args, kwargs, result, before,
                                 self._nan_rule)
        return result


def check(kernel: Kernel, phase: str, result: Any, expected: tuple[Out | None, ...]) -> None:
    """KernelError unless `result` has the outputs `expected` describes (None: unchecked)."""
    outputs = result if isinstance(result, tuple) else (result,)
    if len(outputs) != len(expected):
        _broken(kernel, phase, f"returned {len(outputs)} output(s); the contract is "
                               f"{len(expected)}")
    for index, want in enumerate(expected):  # a plain loop: this runs on every call
        got = outputs[index]
        if want is not None and (not isinstance(got, Tensor) or not _allowed(got.dtype, want)
                                 or got.shape != want.shape or got.device != want.device):
            found = (_describe(Out(tuple(got.shape), got.dtype, got.device))
                     if isinstance(got, Tensor) else f"{type(got).__name__}, not a tensor")
            _broken(kernel, phase, f"output {index} is {found}; the contract is "
                                   f"{_describe(want)}")


def attribute(exc: BaseException, kernel: Kernel, phase: str) -> None:
    """Note on `exc` which backend raised it and how to run without that backend.

    The innermost kernel names the culprit; kernels it ran inside add where it was called.
    """
    what = f"backend '{kernel.backend}' ({kernel.op} {phase}, {kernel.target})"
    if origin(exc) is not None:
        _add_note(exc, f"{_NOTE} ... raised inside {what}")
        return
    exc._rlk_kernel = kernel  # type: ignore[attr-defined]
    text = f"{_NOTE} raised by {what}"
    if kernel.plugin and kernel.backend != "native":
        text += (f", from plugin '{kernel.plugin}' ({kernel.distribution or 'no distribution'})."
                 f" To run without it: RLK_DISABLE_PLUGINS={kernel.plugin}, or prefer another "
                 "backend with rlk.use_backends(...)")
    _add_note(exc, text)


def origin(exc: BaseException) -> Kernel | None:
    """The kernel that raised `exc` (the innermost one, when kernels ran nested), if any."""
    return getattr(exc, "_rlk_kernel", None)


def _add_note(exc: BaseException, text: str) -> None:
    if hasattr(exc, "add_note"):
        exc.add_note(text)
    else:  # Python 3.10: keep the note where 3.11's traceback would print it from
        exc.__notes__ = [*getattr(exc, "__notes__", []), text]


def _allowed(dtype: torch.dtype, want: Out) -> bool:
    return dtype == want.dtype or dtype in want.alternatives


def _describe(out: Out) -> str:
    names = " or ".join(dict.fromkeys(str(d).replace("torch.", "")
                                      for d in (out.dtype, *out.alternatives)))
    return f"{names} {list(out.shape)} on {out.device}"


def _broken(kernel: Kernel, phase: str, problem: str) -> None:
    hint = (f" To run without it: RLK_DISABLE_PLUGINS={kernel.plugin}, or prefer another "
            "backend with rlk.use_backends(...)." if kernel.backend != "native" else "")
    raise KernelError(f"backend '{kernel.backend}' broke the '{kernel.op}' contract: its "
                      f"{phase} kernel {kernel.target} {problem}.{hint}")
