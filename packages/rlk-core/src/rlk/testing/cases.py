"""Which (op, dtype, sample) cases the kit runs for a backend on a device."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlk._runtime.contract import BoundKernel
from rlk._runtime.spec import OpSpec, Sample, specs
from rlk.dispatch import get_dispatcher
from rlk.registry import Kernel


@dataclass(frozen=True)
class Case:
    spec: OpSpec
    kernel: Kernel
    dtype: torch.dtype
    sample: Sample
    device: torch.device

    @property
    def id(self) -> str:
        return f"{self.spec.name}-{str(self.dtype).replace('torch.', '')}-{self.sample.name}"

    @property
    def bound(self) -> BoundKernel:
        """The kernel with its op's output contract checked, by metadata as ops call it and
        by value (inputs unchanged, no aliases, NaN only where allowed) as the kit wants."""
        bound = self.spec.bind(self.kernel)
        bound.verify_values = True
        return bound


def backend_kernels(backend: str) -> dict[str, Kernel]:
    """The kernels a backend registered, by op; raises naming the recorded cause if the
    backend is not registered (its plugin failed, is blocked, or does not exist)."""
    dispatcher = get_dispatcher()
    dispatcher.loader.ensure_loaded()
    if backend not in dispatcher.registry.backends:
        raise ValueError(f"backend {backend!r} is {dispatcher.missing(backend)}")
    return {
        op: kernel
        for op, kernels in dispatcher.registry.kernels.items()
        for kernel in kernels
        if kernel.backend == backend
    }


def conformance_cases(backend: str, device: torch.device) -> list[Case]:
    kernels = backend_kernels(backend)
    cases = []
    for name, spec in specs().items():
        kernel = kernels.get(name)
        if kernel is None:
            continue
        dtypes = [d for d in spec.dtypes if kernel.dtypes is None or d in kernel.dtypes]
        for dtype in dtypes:
            for sample in spec.samples(device, dtype):
                cases.append(Case(spec, kernel, dtype, sample, device))
    return cases
