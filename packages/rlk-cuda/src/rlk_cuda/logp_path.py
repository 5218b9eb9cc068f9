"""Which logp forward kernel runs: the generic one (default) or Hopper's bulk-copy one.

``RLK_CUDA_LOGP_FORWARD=tma`` asks for the bulk-copy (TMA) forward of ``csrc/logp_tma.cu``. It
exists only in builds with sm_90a code (``_C.TMA_BUILT``) and runs only on compute capability
9.0, so asking for it anywhere else is an error, never a silent fallback. Unset, empty or
``generic`` keeps the generic kernel, which is as fast on the H200 (docs/backends/cuda.md).
"""

from __future__ import annotations

import functools
import os

import torch

from . import _ext

ENV = "RLK_CUDA_LOGP_FORWARD"
CHOICES = ("generic", "tma")


def requested() -> str:
    """The forward the environment asks for; ValueError for anything but the known choices."""
    raw = os.environ.get(ENV, "")
    value = raw.strip().lower() or "generic"
    if value not in CHOICES:
        raise ValueError(f"{ENV} must be one of {', '.join(CHOICES)}; got {raw!r}")
    return value


def tma_unavailable(built: bool, capability: tuple[int, int]) -> str | None:
    """None when the bulk-copy forward can run on a device of `capability`, else why not."""
    if not built:
        return (f"this {__package__} build has no sm_90a code "
                "(RLK_CUDA_ARCHITECTURES without 90a)")
    if capability != (9, 0):
        return f"it runs on sm_90 devices only; this device is sm_{capability[0]}{capability[1]}"
    return None


@functools.cache
def _capability(device: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def use_tma(device: int) -> bool:
    """Whether the forward on CUDA device `device` takes the bulk-copy path.

    RuntimeError when the environment asks for it and it cannot run there.
    """
    if requested() == "generic":
        return False
    reason = tma_unavailable(bool(_ext.load().TMA_BUILT), _capability(device))
    if reason is not None:
        raise RuntimeError(f"{ENV}=tma: {reason}")
    return True
