"""Input checks shared by every op: clear errors naming what was expected and received."""

from __future__ import annotations

from collections.abc import Sequence

import torch

FLOATS = (torch.float32, torch.bfloat16, torch.float16)
INDICES = (torch.int32, torch.int64)


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


def positive_scalar(name: str, value: object, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    number = float(value)
    if not (number >= 0.0 if allow_zero else number > 0.0) or number == float("inf"):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be finite and {bound}, got {value}")
    return number


def integer(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return value


def first_bad(name: str, bad: torch.Tensor, values: torch.Tensor, allowed: str) -> None:
    """Raise ValueError naming the first position where `bad` holds (one device sync)."""
    if bool(bad.any()):
        position = tuple(int(i) for i in torch.nonzero(bad)[0].tolist())
        where = position if len(position) > 1 else position[0]
        raise ValueError(
            f"{name}[{where}] = {values[position].item()} is outside {allowed}"
        )
