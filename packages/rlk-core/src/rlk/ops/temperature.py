"""Temperature arguments: a float, or one value per row; validated and split in one place.

torch operator schemas cannot take `float | Tensor`, so ops pass an optional
per-row tensor plus a float, and kernels receive them joined again.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlk.ops import validate

Temperature = float | Tensor


def prepare(temperature: object, lead: tuple[int, ...], anchor: Tensor,
            anchor_name: str) -> Temperature:
    """A validated float > 0, or a float32 [rows] tensor from one of the leading shape."""
    if isinstance(temperature, Tensor):
        validate.tensor("temperature", temperature, validate.FLOATS)
        validate.shape("temperature", temperature, lead, f" (one per row of {anchor_name})")
        validate.same_device("temperature", temperature, anchor, anchor_name)
        return temperature.reshape(-1).to(torch.float32)
    return validate.positive_scalar("temperature", temperature)


def check_range(temperature: Temperature) -> None:
    """The opt-in (RLK_CHECK_INPUTS) check of per-row values: each finite and > 0."""
    if isinstance(temperature, Tensor):
        bad = ~(temperature > 0) | ~torch.isfinite(temperature)
        validate.first_bad("temperature", bad, temperature, "(0, inf)")


def split(temperature: Temperature) -> tuple[Tensor | None, float]:
    """(per-row tensor or None, float) as torch operator arguments."""
    if isinstance(temperature, Tensor):
        return temperature, 1.0
    return None, float(temperature)


def join(tensor: Tensor | None, value: float) -> Temperature:
    return value if tensor is None else tensor
