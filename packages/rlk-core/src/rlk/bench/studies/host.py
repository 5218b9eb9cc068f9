"""Host time per call beside wall and GPU time: what the studies of small ops print.

The GPU work of a small op takes microseconds; what a trainer pays is the Python between
the call and the kernel. A call whose host time nears its wall time is host-bound.
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
from collections.abc import Callable

import torch

from rlk.bench import timing

CPU = torch.device("cpu")


def median_ms(call: Callable[[], object], reps: int, device: torch.device = CPU,
              warmup: int = 20) -> float:
    """Median milliseconds of one call after `warmup` calls (CUDA events on a GPU)."""
    for _ in range(warmup):
        call()
    return statistics.median(timing.time_calls(lambda i: call(), reps, device))


def gpu_ms(call: Callable[[], object], calls: int = 20) -> float:
    """GPU milliseconds per call, from torch.profiler's device time of `calls` calls."""
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    return sum(event.self_device_time_total for event in prof.key_averages()) / calls / 1e3


def line(name: str, call: Callable[[], object], reps: int, device: torch.device,
         warmup: int = 3, gpu: bool = False, width: int = 46) -> str:
    """`name host .. ms  wall .. ms [gpu .. ms]`; a call that raises is a line saying so."""
    try:
        host, wall = timing.host_and_wall_ms(call, reps, device, warmup)
        text = f"{name:{width}s} host {host:.4f} ms  wall {wall:.4f} ms"
        return text + (f"  gpu {gpu_ms(call):.4f} ms" if gpu else "")
    except Exception as exc:  # a missing backend or peer is a line, not the end of the study
        first = (str(exc).splitlines() or [""])[0][:80]
        return f"{name:{width}s} failed: {type(exc).__name__}: {first}"


def profile(call: Callable[[], object], calls: int, rows: int) -> None:
    """Print a cProfile of `calls` calls by own time, `rows` functions."""
    profiler = cProfile.Profile()
    profiler.runcall(lambda: [call() for _ in range(calls)])
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(rows)
