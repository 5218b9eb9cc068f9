"""Extra memory of one call above what was live before it (its inputs included there).

CUDA: the caching allocator's peak minus what was allocated before the call. CPU: the
growth of the process's peak resident set (VmHWM, reset before the call where Linux
allows it), which also sees memory outside torch's allocator.
"""

from __future__ import annotations

import gc
import resource
from collections.abc import Callable
from typing import TypeVar

import torch

from rlk.bench.timing import synchronize

T = TypeVar("T")

CUDA_METHOD = "cuda: peak allocated minus allocated before the call"
RSS_METHOD = "cpu: peak RSS growth during the call"
MAXRSS_METHOD = "cpu: growth of the process's lifetime peak RSS (a lower bound)"


def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


def extra(call: Callable[[], T], device: torch.device) -> tuple[T, int, str]:
    """The call's result, the bytes it needed above the baseline, and how that was measured."""
    gc.collect()
    if device.type == "cuda":
        synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = call()
        synchronize(device)
        return result, torch.cuda.max_memory_allocated(device) - base, CUDA_METHOD
    rss = _status_bytes("VmRSS")
    if rss is not None and _reset_peak_rss():
        result = call()
        peak = _status_bytes("VmHWM")
        if peak is not None:
            return result, max(0, peak - rss), RSS_METHOD
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = call()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return result, max(0, after - before) * 1024, MAXRSS_METHOD
