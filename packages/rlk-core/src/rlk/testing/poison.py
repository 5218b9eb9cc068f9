"""Poisoned allocations: prove a kernel writes every element of what it returns.

Inside the context, `torch.empty`, `torch.empty_like` and `Tensor.new_empty`
return tensors filled with NaN (floating) or a sentinel (integers), so an output
element a kernel forgot to write shows up as a wrong value instead of happening
to hold a plausible leftover.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

INT_POISON = -0x5A5A5A5A


def _poison(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.numel() == 0:
        return tensor
    if tensor.is_floating_point() or tensor.is_complex():
        return tensor.fill_(float("nan"))
    if tensor.dtype == torch.bool:
        return tensor.fill_(True)
    info = torch.iinfo(tensor.dtype)
    return tensor.fill_(max(info.min, INT_POISON) if info.min < 0 else info.max)


@contextlib.contextmanager
def poisoned_allocations() -> Iterator[None]:
    real_empty, real_empty_like = torch.empty, torch.empty_like
    real_new_empty = torch.Tensor.new_empty

    def empty(*args: Any, **kwargs: Any) -> torch.Tensor:
        return _poison(real_empty(*args, **kwargs))

    def empty_like(*args: Any, **kwargs: Any) -> torch.Tensor:
        return _poison(real_empty_like(*args, **kwargs))

    def new_empty(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return _poison(real_new_empty(self, *args, **kwargs))

    torch.empty, torch.empty_like = empty, empty_like
    torch.Tensor.new_empty = new_empty  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.empty, torch.empty_like = real_empty, real_empty_like
        torch.Tensor.new_empty = real_new_empty  # type: ignore[method-assign]
