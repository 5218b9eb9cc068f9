"""Input checks shared by every op: clear errors naming what was expected and received."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import is_fake

from rlk import config

FLOATS = (torch.float32, torch.bfloat16, torch.float16)  # what the kernels of most ops take
ANY_FLOAT = (*FLOATS, torch.float64)  # what ops that read each input in its own dtype take
INDICES = (torch.int32, torch.int64)
_INT64 = (-(2**63), 2**63)
FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def tensor(name: str, value: object, dtypes: Sequence[torch.dtype]) -> torch.Tensor:
    """Require a tensor of one of `dtypes` (TypeError otherwise)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype not in dtypes:
        allowed = ", ".join(_name(d) for d in dtypes)
        raise TypeError(f"{name} must have dtype {allowed}; got {_name(value.dtype)}")
    return value


def shape(name: str, value: torch.Tensor, expected: Sequence[int], hint: str = "") -> None:
    if tuple(value.shape) != tuple(expected):
        raise ValueError(
            f"{name} must have shape {tuple(expected)}{hint}; got {tuple(value.shape)}"
        )


def same_device(name: str, value: torch.Tensor, reference: torch.Tensor, ref_name: str) -> None:
    if value.device != reference.device:
        raise ValueError(
            f"{name} is on {value.device} but {ref_name} is on {reference.device}; "
            "move them to one device"
        )


def real(name: str, value: object) -> float:
    """A Python or NumPy real number as a float (bools and tensors are refused), within
    float32's range (`in_float32`); inf and NaN pass, for the caller's own bounds."""
    if type(value) is float:  # the common case, without the ABC check's host time
        number = value
    elif isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    else:
        number = float(value)
    in_float32(name, number)
    return number


def in_float32(name: str, number: Any) -> None:
    """Refuse a finite number beyond float32's range: every backend applies scalar settings
    in float32, where it would silently become inf. (Symbolic values compare too.)"""
    beyond = number > FLOAT32_MAX or number < -FLOAT32_MAX
    if beyond and -math.inf < number < math.inf:
        raise ValueError(f"{name} must be within float32's range (|{name}| <= "
                         f"{FLOAT32_MAX:.7g}): kernels apply it in float32, where it would "
                         f"be inf; got {number!r}")


def boolean(name: str, value: object) -> bool:
    """True or False, Python's or NumPy's (not 0/1, not a string, not a tensor)."""
    if value is True or value is False:
        return value
    kind = type(value)
    if kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_"):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {kind.__name__} {value!r}")


def positive_scalar(name: str, value: object, *, allow_zero: bool = False) -> float:
    number = real(name, value)
    if not (number >= 0.0 if allow_zero else number > 0.0) or number == float("inf"):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be finite and {bound}, got {value}")
    return number


def integer(name: str, value: object) -> int:
    """A Python or NumPy integer that fits in int64 (what torch operators take)."""
    if type(value) is int and _INT64[0] <= value < _INT64[1]:  # the common case, quickly
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    number = int(value)
    if not _INT64[0] <= number < _INT64[1]:
        raise ValueError(f"{name} must fit in int64 ([-2**63, 2**63)), got {number}")
    return number


def first_bad(name: str, bad: torch.Tensor, values: torch.Tensor, allowed: str) -> None:
    """Raise ValueError naming the first position where `bad` holds (one device sync)."""
    if bool(bad.any()):
        position = tuple(int(i) for i in torch.nonzero(bad)[0].tolist())
        where = position if len(position) > 1 else position[0]
        raise ValueError(
            f"{name}[{where}] = {values[position].item()} is outside {allowed}"
        )


def _symbolic(value: torch.Tensor) -> bool:
    return value.is_meta or is_fake(value)


def value_checks(*tensors: torch.Tensor | None) -> bool:
    """Whether the opt-in checks of values (RLK_CHECK_INPUTS=1) run for this call.

    They read values, so they need real tensors: meta and fake tensors (shape
    propagation, torch.compile tracing) skip them, and so does any call while
    torch.compile traces, where reading a value would break the graph.
    """
    return config.checking_inputs() and readable(*tensors)


def readable(*tensors: object) -> bool:
    """Whether these values can be read now: no meta or fake tensor among them, and no
    torch.compile tracing (reading a value would break the graph)."""
    if torch.compiler.is_compiling():
        return False
    return not any(isinstance(t, torch.Tensor) and _symbolic(t) for t in tensors)


def _byte_span(value: torch.Tensor) -> tuple[int, int]:
    """[first, last] byte offsets a tensor may touch within its storage."""
    first = int(value.storage_offset())
    last = first + sum(int(size - 1) * abs(int(step)) for size, step in
                       zip(value.shape, value.stride(), strict=True))
    return first * value.element_size(), (last + 1) * value.element_size() - 1


def shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors may touch the same bytes (conservatively: overlapping spans
    of one storage). Meta and fake tensors hold no memory and never share it; while
    torch.compile traces, storages cannot be compared (nor `is_fake` called: dynamo skips
    it), and the traced graph's functionalization owns out='s aliasing."""
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    if not readable(a, b):
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    a_first, a_last = _byte_span(a)
    b_first, b_last = _byte_span(b)
    return a_first <= b_last and b_first <= a_last


def no_overlap(name: str, value: torch.Tensor, others: dict[str, torch.Tensor | None]) -> None:
    """Refuse an output that shares memory with an input or another output (the kernel
    would read what it has already overwritten, or write two results to one place)."""
    for other_name, other in others.items():
        if other is not None and shares_memory(value, other):
            raise ValueError(
                f"{name} shares memory with {other_name}; pass a separate tensor"
            )
