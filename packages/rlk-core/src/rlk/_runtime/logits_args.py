"""Public arguments shared by the ops that read logits row by row (logp, logp_entropy,
entropy): their checks, and what the ops return in which dtype.

Kernels compute in float32 (float64 for float64 logits) and write that dtype, the
*compute dtype*; `dtype=` casts afterwards, and `out=` of another dtype or layout is
filled from a fresh result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from rlk._runtime import validate

LOGITS_DTYPES = validate.ANY_FLOAT
OUTPUT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
MASK_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
               *OUTPUT_DTYPES)


def compute_dtype(logits: Tensor) -> torch.dtype:
    """What kernels compute and write: float64 for float64 logits, float32 otherwise."""
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def logits_rows(logits: Tensor) -> tuple[Tensor, tuple[int, ...]]:
    """Validated logits as [M, V], and their leading shape."""
    validate.tensor("logits", logits, LOGITS_DTYPES)
    if logits.dim() < 1:
        raise ValueError("logits must be [..., V]; got a 0-d tensor")
    lead, vocab = tuple(logits.shape[:-1]), logits.shape[-1]
    if vocab < 1 and math.prod(lead) > 0:
        raise ValueError(f"logits must have V >= 1 columns when it has rows; "
                         f"got shape {tuple(logits.shape)}")
    flat = logits if len(lead) == 1 else logits.reshape(math.prod(lead), vocab)
    return flat, lead


def rows_arg(rows: Tensor | None, logits: Tensor) -> Tensor | None:
    if rows is None:
        return None
    validate.tensor("rows", rows, (torch.int64,))
    if rows.dim() != 1:
        raise ValueError(f"rows must be a 1-D int64 tensor; got shape {tuple(rows.shape)}")
    validate.same_device("rows", rows, logits, "logits")
    return rows


def check_rows_range(rows: Tensor | None, num_rows: int) -> None:
    """The opt-in check (RLK_CHECK_INPUTS=1) of row indices."""
    if rows is not None:
        validate.first_bad("rows", (rows < 0) | (rows >= num_rows), rows, f"[0, {num_rows})")


def keep_mask(mask: Tensor | None, shape: tuple[int, ...], anchor: Tensor,
              what: str) -> Tensor | None:
    """`mask` as bool (nonzero = counts), validated against `shape`; None stays None."""
    if mask is None:
        return None
    validate.tensor("mask", mask, MASK_DTYPES)
    validate.shape("mask", mask, shape, f" ({what})")
    validate.same_device("mask", mask, anchor, "logits")
    return mask if mask.dtype == torch.bool else mask != 0


def output_dtype(dtype: torch.dtype | None, logits: Tensor, out: Tensor | None) -> torch.dtype:
    """The dtype the caller gets: `dtype`, else out's dtype, else the compute dtype."""
    if dtype is not None:
        if not isinstance(dtype, torch.dtype) or dtype not in OUTPUT_DTYPES:
            allowed = ", ".join(str(d).replace("torch.", "") for d in OUTPUT_DTYPES)
            raise TypeError(f"dtype must be one of {allowed}; got {dtype!r}")
        if out is not None and out.dtype != dtype:
            raise TypeError(f"out has dtype {out.dtype} but dtype={dtype} was asked for; "
                            "give one of them")
        return dtype
    return out.dtype if out is not None else compute_dtype(logits)


@dataclass(frozen=True)
class Out:
    """A caller's `out` tensor: the kernel writes into `direct` when that is possible
    (compute dtype, contiguous), else the op fills `target` from a fresh result."""

    target: Tensor
    direct: Tensor | None

    def fill(self, result: Tensor) -> Tensor:
        if self.direct is None:
            self.target.copy_(result.view(self.target.shape))
        return self.target


def out_arg(name: str, out: Tensor, shape: tuple[int, ...], kernel_shape: tuple[int, ...],
            logits: Tensor, inputs: dict[str, Tensor | None]) -> Out:
    """Validate an `out=` tensor of the output `shape` against the call's inputs; kernels
    write `kernel_shape` (rows flattened)."""
    validate.tensor(name, out, OUTPUT_DTYPES)
    validate.shape(name, out, shape)
    validate.same_device(name, out, logits, "logits")
    validate.no_overlap(name, out, inputs)
    if torch.is_grad_enabled() and logits.requires_grad:
        raise RuntimeError(
            f"{name}= does not support autograd; call without {name}= to differentiate"
        )
    direct = out.dtype == compute_dtype(logits) and out.is_contiguous()
    return Out(out, out.view(kernel_shape) if direct else None)
