"""The machine's own ceilings, measured at the start of every run.

Copy bandwidth counts bytes read plus bytes written of a device-to-device copy far
larger than any cache; the GEMM rate is a square matrix product in the run's dtype
(bf16 on GPU by default). Rows are placed against these, not against a datasheet.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlk.bench import timing

MIB = 1 << 20


@dataclass(frozen=True)
class Ceilings:
    copy_gbps: float
    copy_bytes: int
    gemm_tflops: float
    gemm_size: int
    gemm_dtype: str

    def roofline_ms(self, moved: float, flops: float) -> tuple[float, str]:
        """Least time for that work on this machine, and which ceiling binds."""
        memory_ms = moved / (self.copy_gbps * 1e9) * 1e3
        compute_ms = flops / (self.gemm_tflops * 1e12) * 1e3
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


def measure(device: torch.device, dtype: torch.dtype, smoke: bool) -> Ceilings:
    gpu = device.type == "cuda"
    size = (64 if smoke else 1024) * MIB if gpu else (16 if smoke else 256) * MIB
    n = (2048 if smoke else 8192) if gpu else (256 if smoke else 1024)
    budget = timing.SMOKE if smoke else timing.FULL
    return Ceilings(
        copy_gbps=_copy_gbps(size, device, budget),
        copy_bytes=size,
        gemm_tflops=_gemm_tflops(n, dtype, device, budget),
        gemm_size=n,
        gemm_dtype=str(dtype).replace("torch.", ""),
    )
