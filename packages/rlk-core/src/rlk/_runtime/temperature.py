"""Temperature arguments: a number, or one value per row; validated and split in one place.

Kernels compute 1 / T in float32, so a temperature must be a normal float32 number:
`MIN_TEMPERATURE` (2**-126, about 1.2e-38) <= T < inf; below it 1 / T overflows.
A number outside that range raises. A tensor (one value per row, or a 0-d tensor for
every row) is checked on its device without a sync: a row whose temperature is out of
range gets NaN as its temperature, so that row's outputs and gradient are NaN and no
other row changes. With RLK_CHECK_INPUTS=1 such a value raises instead, naming it.

torch operator schemas cannot take `float | Tensor`: rlk._runtime.signature's
`temperature_param` is the one place the two cross into each other.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rlk._runtime import validate

Temperature = float | Tensor

MIN_TEMPERATURE = torch.finfo(torch.float32).tiny
_RANGE = f"[{MIN_TEMPERATURE!r}, inf)"
# Below this temperature, logits / T overflows float32 once |logits| reach 2**64.
SHIFT_BELOW = 2.0**-64


def overflow_safe(logits: Tensor, temperature: float) -> tuple[Tensor, float]:
    """(logits, T) giving the same softmax(logits / T), safe to divide in float32.

    For a sampler that scales float32 logits by 1 / T itself (FlashInfer, vLLM): below
    SHIFT_BELOW each row (which must have a finite maximum) is shifted by its maximum and
    divided here, in float32, so that every value is at most 0 and what is left to divide
    by is 1; above it the arguments come back unchanged, so results stay bit-identical to
    the sampler's own scaling."""
    if not 0.0 < temperature < SHIFT_BELOW:
        return logits, temperature
    wide = logits.float()
    return (wide - wide.amax(dim=-1, keepdim=True)) / temperature, 1.0


def scalar(name: str, value: object, *, allow_zero: bool = False) -> float:
    """A validated temperature number (Python or NumPy); 0 only where `allow_zero`."""
    number = validate.real(name, value)
    if (allow_zero and number == 0.0) or MIN_TEMPERATURE <= number < math.inf:
        return number
    sign = ">= 0 (0 = greedy); a nonzero one" if allow_zero else "> 0,"
    raise ValueError(f"{name} must be finite and {sign} at least {MIN_TEMPERATURE!r} "
                     f"(the smallest normal float32: kernels compute 1 / {name} in float32); "
                     f"got {value!r}")


def prepare(temperature: object, lead: tuple[int, ...], anchor: Tensor,
            anchor_name: str) -> Temperature:
    """A validated float, or a detached [rows] tensor (float32; float64 for a float64
    anchor): one value per row of the leading shape `lead`, or a 0-d tensor broadcast to
    every row. Out-of-range values become NaN."""
    if not isinstance(temperature, Tensor):
        return scalar("temperature", temperature)
    validate.tensor("temperature", temperature, (*validate.FLOATS, torch.float64))
    if temperature.dim() > 0:
        validate.shape("temperature", temperature, lead,
                       f" (one per row of {anchor_name}, or a 0-d tensor)")
    validate.same_device("temperature", temperature, anchor, anchor_name)
    # detached: no op differentiates w.r.t. the temperature
    values = temperature.detach().to(torch.float64 if anchor.dtype == torch.float64
                                     else torch.float32)
    in_range = (values >= MIN_TEMPERATURE) & (values < math.inf)
    if validate.value_checks(values):
        _raise_out_of_range(values, in_range)
    return torch.where(in_range, values, math.nan).expand(lead).reshape(-1)


def _raise_out_of_range(values: Tensor, in_range: Tensor) -> None:
    """The opt-in check (RLK_CHECK_INPUTS=1): name the first value out of range."""
    if values.dim() > 0:
        validate.first_bad("temperature", ~in_range, values, _RANGE)
    elif not bool(in_range):
        raise ValueError(f"temperature = {values.item()} is outside {_RANGE}")
