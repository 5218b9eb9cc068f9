"""linear_logp's forward as one QuACK GEMM whose epilogue keeps only two numbers a row.

`lse_target_epi` folds each output tile into a per-row online log-sum-exp and copies out
the target column's logit, in float32 from the accumulator; logp = target logit - lse. The
logits are never stored: O(N) memory, and 0.94-0.99x one cuBLAS GEMM's time where QuACK's
autotuned configuration was measured (docs/backends/quack.md).

The epilogue sees raw logits: no bias, temperature, soft cap or vocabulary shards. `check`
declines those calls, and every call that needs a gradient finds no backward here, so the
dispatcher hands them to the next backend (rlk-cuda).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlk.backend import Temperature
from rlk_quack import library

# TMA reads a row from a 16-byte aligned address, in whole 16-byte steps
_ALIGNMENT_BYTES = 16
_RAW = "QuACK's LSE epilogue reads the raw logits"


def check(hidden: Tensor, weight: Tensor, bias: Tensor | None, temperature: Temperature,
          group: object, softcap: float | None, **_: object) -> str | None:
    """None when QuACK's epilogue computes this call's result, else why not."""
    if bias is not None:
        return f"a bias ({_RAW})"
    if isinstance(temperature, Tensor) or temperature != 1.0:
        return f"a temperature or logit_scale other than 1 ({_RAW})"
    if softcap is not None:
        return f"a soft cap ({_RAW})"
    if group is not None:
        return "a vocabulary-sharded weight (group): QuACK's epilogue sees one device's columns"
    if weight.dtype != hidden.dtype:
        return (f"a {_name(weight.dtype)} weight beside a {_name(hidden.dtype)} hidden: the "
                "GEMM reads one dtype, and casting the weight would copy it on every call")
    width, size = hidden.shape[-1], hidden.element_size()
    if width * size % _ALIGNMENT_BYTES:
        return (f"H={width}: QuACK's TMA loads need rows of a multiple of {_ALIGNMENT_BYTES} "
                f"bytes (H a multiple of {_ALIGNMENT_BYTES // size})")
    if not _tma_ready(weight):
        return ("a weight whose rows are not contiguous and 16-byte aligned (copying it would "
                "cost more than the GEMM saves)")
    return None


def forward(hidden: Tensor, weight: Tensor, tokens: Tensor, bias: Tensor | None,
            temperature: Temperature, ignore_index: int, with_entropy: bool, group: object,
            softcap: float | None) -> tuple[Tensor, Tensor | None, Tensor]:
    """linear_logp's forward (rlk.backend.LinearLogpForward) for the calls `check` takes."""
    rows, vocab = hidden.shape[0], weight.shape[0]
    if rows == 0:
        return (hidden.new_empty(0, dtype=torch.float32), None,
                hidden.new_empty(0, dtype=torch.float64))
    if not _tma_ready(hidden):
        hidden = hidden.contiguous()  # N x H: small beside the GEMM
    found = library.load_lse_target()(hidden, weight.mT, store_d=False, target=tokens,
                                      tuned=False)
    lse, target_logit = found["lse"], found["target_logit"]
    # QuACK leaves an out-of-range target's logit unwritten (uninitialised): NaN, as rlk's
    # contract says; a row whose log-sum-exp is not finite has no log-probabilities either.
    valid = (tokens >= 0) & (tokens < vocab) & torch.isfinite(lse)
    logp = torch.where(valid, target_logit - lse, torch.nan)
    return logp.masked_fill_(tokens == ignore_index, 0.0), None, lse.to(torch.float64)


def _tma_ready(matrix: Tensor) -> bool:
    """Rows contiguous, each starting on a 16-byte boundary."""
    size = matrix.element_size()
    return (matrix.stride(-1) == 1 and matrix.stride(0) * size % _ALIGNMENT_BYTES == 0
            and matrix.data_ptr() % _ALIGNMENT_BYTES == 0)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
