"""Timing: CUDA events on GPU, perf_counter on CPU; median of many calls after warm-up.

Each call gets its own pair of events and the host never waits between calls, so
the GPU stays busy and host overhead hides as it does in training. A per-call
`setup` (restoring an input a peer overwrites) runs before the start event.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Budget:
    """How long to time each row: warm-up calls, then enough calls to fill `seconds`."""

    warmup: int
    seconds: float
    min_reps: int
    max_reps: int

    def reps(self, estimate_ms: float) -> int:
        wanted = int(self.seconds * 1e3 / max(estimate_ms, 1e-3))
        return max(self.min_reps, min(self.max_reps, wanted))


FULL = Budget(warmup=3, seconds=0.5, min_reps=10, max_reps=100)
SMOKE = Budget(warmup=1, seconds=0.05, min_reps=3, max_reps=5)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(call: Callable[[int], object], reps: int, device: torch.device,
               setup: Callable[[int], None] | None = None) -> list[float]:
    """Milliseconds of call(0), ..., call(reps - 1)."""
    if device.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        stops = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            if setup is not None:
                setup(i)
            starts[i].record()
            call(i)
            stops[i].record()
        torch.cuda.synchronize(device)
        return [start.elapsed_time(stop) for start, stop in zip(starts, stops, strict=True)]
    times = []
    for i in range(reps):
        if setup is not None:
            setup(i)
        began = time.perf_counter()
        call(i)
        times.append((time.perf_counter() - began) * 1e3)
    return times


@dataclass(frozen=True)
class Timing:
    median_ms: float
    min_ms: float
    reps: int


def measure(call: Callable[[int], object], budget: Budget, device: torch.device,
            setup: Callable[[int], None] | None = None) -> Timing:
    """Warm up, size the repetitions from one timed call, then the median of the rest."""
    if budget.warmup > 1:
        time_calls(call, budget.warmup - 1, device, setup)
    (estimate,) = time_calls(call, 1, device, setup)
    times = time_calls(call, budget.reps(estimate), device, setup)
    return Timing(statistics.median(times), min(times), len(times))


def wall_ms(call: Callable[[], object], device: torch.device) -> tuple[object, float]:
    """One call's result and its wall time, synchronised (first calls: compilation, autotune)."""
    synchronize(device)
    began = time.perf_counter()
    result = call()
    synchronize(device)
    return result, (time.perf_counter() - began) * 1e3


def host_and_wall_ms(call: Callable[[], object], reps: int, device: torch.device,
                     warmup: int = 3) -> tuple[float, float]:
    """Milliseconds per call on the host (no sync inside the loop: the Python and launch
    cost) and of wall time once the device has drained, for host-bound small ops."""
    for _ in range(warmup):
        call()
    synchronize(device)
    began = time.perf_counter()
    for _ in range(reps):
        call()
    host = time.perf_counter() - began
    synchronize(device)
    wall = time.perf_counter() - began
    return host / reps * 1e3, wall / reps * 1e3
