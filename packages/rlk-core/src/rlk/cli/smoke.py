"""`doctor --smoke`: every registered kernel, run directly on tiny inputs against the float64
reference (forward and backward), so a wrong value is charged to the backend that produced it.

Run through other ops only, a plugin's `logp` that ignores the temperature would surface as
a failure of native `distributed_logp`. Here each kernel runs itself, in every dtype it
declares, on the op's first conformance case plus the first with a temperature other than 1
and the first with an odd vocabulary, all with the kit's value checks on.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from rlk._runtime.contract import origin
from rlk._runtime.spec import OpSpec, Sample, specs
from rlk.dispatch import get_dispatcher
from rlk.errors import describe
from rlk.registry import Kernel, verdict
from rlk.testing.compare import assert_matches

_MAX_ELEMENTS = 2**16  # of the main input: smoke inputs stay tiny


def run(device: torch.device) -> list[dict[str, Any]]:
    """One row per (op, backend, dtype, case): status pass/failure, and for a failure the
    backend whose kernel raised it (native linear_logp may fail inside another's logp)."""
    dispatcher = get_dispatcher()
    rows = []
    for name, spec in specs().items():
        for kernel in dispatcher.registry.kernels[name]:
            if (device.type not in kernel.devices
                    or dispatcher.registry.probe(kernel.backend, device).reason is not None):
                continue
            for dtype in spec.dtypes:
                if kernel.dtypes is None or dtype in kernel.dtypes:
                    rows += [_run_case(spec, kernel, dtype, sample, device)
                             for sample in cases(spec, kernel, device, dtype)]
    return rows


def cases(spec: OpSpec, kernel: Kernel, device: torch.device,
          dtype: torch.dtype) -> Iterator[Sample]:
    """The op's first tiny case, its first at a temperature other than 1 and its first with
    an odd vocabulary (one case may be all three), skipping what the kernel's check refuses."""
    wanted = {"first": _any, "temperature": _hot, "odd": _odd}
    for sample in spec.samples(device, dtype):
        if sample.args[spec.main_input].numel() > _MAX_ELEMENTS:
            continue
        if kernel.check is not None and _refused(kernel, sample):
            continue
        met = [key for key, test in wanted.items() if test(spec, sample)]
        if met:
            for key in met:
                del wanted[key]
            yield sample
        if not wanted:
            return


def _any(spec: OpSpec, sample: Sample) -> bool:
    return True


def _hot(spec: OpSpec, sample: Sample) -> bool:
    temperature = sample.args.get("temperature", 1.0)
    return isinstance(temperature, torch.Tensor) or temperature not in (1.0, 0.0)


def _odd(spec: OpSpec, sample: Sample) -> bool:
    main = sample.args[spec.main_input]
    return main.dim() > 1 and main.shape[-1] % 2 == 1 and main.shape[-1] > 1


def _refused(kernel: Kernel, sample: Sample) -> bool:
    assert kernel.check is not None
    try:
        return verdict("check", kernel.check(**sample.args)) is not None
    except Exception:  # a raising check refuses: explain shows it, the kit fails it
        return True


def _run_case(spec: OpSpec, kernel: Kernel, dtype: torch.dtype, sample: Sample,
              device: torch.device) -> dict[str, Any]:
    row: dict[str, Any] = {"op": spec.name, "device": str(device), "backend": kernel.backend,
                           "dtype": str(dtype).replace("torch.", ""), "case": sample.name,
                           "uses": list(kernel.uses), "raised_by": None, "plugin": kernel.plugin}
    bound = spec.bind(kernel)
    bound.verify_values = True
    try:
        outputs = spec.outputs(bound.forward(**sample.args), sample.args)
        for index, (got, want) in enumerate(zip(outputs, spec.reference(sample.args),
                                                strict=True)):
            assert_matches(f"output {index}", got, want, spec.tolerances[dtype])
        if spec.grad_check is not None and spec.grad_tolerances and sample.check_backward:
            generator = torch.Generator().manual_seed(0)
            for name, got, want in spec.grad_check(bound, dict(sample.args), generator):
                assert_matches(name, got, want, spec.grad_tolerances[dtype])
        row.update(status="pass", detail="")
    except Exception as exc:  # every failure is a finding, never a crash
        culprit = origin(exc)
        if culprit is not None:
            row.update(raised_by=culprit.backend, plugin=culprit.plugin)
        row.update(status="failure", detail=describe(exc))
    return row
