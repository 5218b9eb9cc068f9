"""The declaration every operator makes once, and the dispatch step all ops share."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from rlk.dispatch import get_dispatcher
from rlk.registry import Kernel


@dataclass(frozen=True)
class Tolerance:
    """Allowed distance from the float64 reference: |out - ref| <= atol + rtol * |ref|."""

    atol: float
    rtol: float


@dataclass(frozen=True)
class Sample:
    """One conformance case: kernel-level arguments plus what the kit should check."""

    name: str
    args: dict[str, Any]
    check_backward: bool = True


@dataclass(frozen=True)
class OpSpec:
    """Everything core knows about one operator.

    `main_input` names the kernel argument whose device and dtype drive selection;
    `prepare` turns the public function's arguments into validated kernel arguments;
    `flags` extracts the rest of the selection cache key from kernel arguments;
    `reference` is the float64 truth used only by tests; `samples` yields the
    conformance kit's cases; `tolerances` is per dtype of the main input.
    """

    name: str
    main_input: str
    prepare: Callable[..., dict[str, Any]]
    flags: Callable[[Mapping[str, Any]], tuple[Any, ...]]
    reference: Callable[..., Any]
    samples: Callable[[torch.device, torch.dtype], Iterator[Sample]]
    tolerances: Mapping[torch.dtype, Tolerance]
    dtypes: tuple[torch.dtype, ...]
    differentiable: bool = True
    doc: str = ""

    def kernel(self, args: Mapping[str, Any]) -> Kernel:
        """The selected backend's kernel for these kernel-level arguments."""
        main = args[self.main_input]
        return get_dispatcher().kernel_for(self.name, main.device, main.dtype, self.flags(args), args)
