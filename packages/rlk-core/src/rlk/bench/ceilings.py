"""The machine's own ceilings, measured at the start of every run.

Copy bandwidth counts bytes read plus bytes written of a device-to-device copy far
larger than any cache; the GEMM rate is a square matrix product in each dtype of the
sweep, so that a float32 row is held to float32's rate, not bfloat16's. Rows are placed
against these, not against a datasheet.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from rlk.bench import timing

MIB = 1 << 20


@dataclass(frozen=True)
class Ceilings:
    copy_gbps: float
    copy_bytes: int
    gemm_tflops: float  # in gemm_dtype, the run's first dtype
    gemm_size: int
    gemm_dtype: str
    gemm_tflops_by_dtype: dict[str, float] = field(default_factory=dict)

    def roofline_ms(self, moved: float, flops: float, dtype: str = "") -> tuple[float, str]:
        """Least time for that work on this machine (FLOPs at `dtype`'s GEMM rate where it
        was measured), and which ceiling binds."""
        rate = self.gemm_tflops_by_dtype.get(dtype, self.gemm_tflops)
        memory_ms = moved / (self.copy_gbps * 1e9) * 1e3
        compute_ms = flops / (rate * 1e12) * 1e3
        return (compute_ms, "compute") if compute_ms > memory_ms else (memory_ms, "memory")


def _copy_gbps(size: int, device: torch.device, budget: timing.Budget) -> float:
    src = torch.ones(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy = timing.measure(lambda i: dst.copy_(src), budget, device)
    return 2 * size / (copy.median_ms * 1e-3) / 1e9


def _gemm_tflops(n: int, dtype: torch.dtype, device: torch.device,
                 budget: timing.Budget) -> float:
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, generator=gen, device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen, device=device, dtype=dtype)
    gemm = timing.measure(lambda i: a @ b, budget, device)
    return 2 * n**3 / (gemm.median_ms * 1e-3) / 1e12


def measure(device: torch.device, dtypes: Sequence[torch.dtype], smoke: bool) -> Ceilings:
    """Copy bandwidth, and the GEMM rate in each of `dtypes` (the first is the headline)."""
    gpu = device.type == "cuda"
    size = (64 if smoke else 1024) * MIB if gpu else (16 if smoke else 256) * MIB
    n = (2048 if smoke else 8192) if gpu else (256 if smoke else 1024)
    budget = timing.SMOKE if smoke else timing.FULL
    rates = {str(d).replace("torch.", ""): _gemm_tflops(n, d, device, budget) for d in dtypes}
    first = str(dtypes[0]).replace("torch.", "")
    return Ceilings(
        copy_gbps=_copy_gbps(size, device, budget),
        copy_bytes=size,
        gemm_tflops=rates[first],
        gemm_size=n,
        gemm_dtype=first,
        gemm_tflops_by_dtype=rates,
    )
