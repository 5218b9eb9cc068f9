"""`doctor --smoke`: run each selected kernel on tiny inputs against the float64 reference."""

from __future__ import annotations

from typing import Any

import torch

from rlk._runtime.contract import origin
from rlk._runtime.spec import specs
from rlk.cli.matrix import representative_dtype
from rlk.errors import describe
from rlk.testing.compare import assert_matches

_CASES_PER_OP = 3


def run(device: torch.device) -> list[dict[str, Any]]:
    """One row per (op, case): status pass/failure, the backend selected, and for a failure
    the backend whose kernel raised it (native linear_logp may fail in another's logp)."""
    rows = []
    for name, spec in specs().items():
        dtype = representative_dtype(spec, device)
        for index, sample in enumerate(spec.samples(device, dtype)):
            if index >= _CASES_PER_OP:
                break
            row: dict[str, Any] = {"op": name, "device": str(device), "case": sample.name,
                                   "backend": None, "raised_by": None, "plugin": None}
            try:
                kernel = spec.kernel(sample.args)
                row["backend"] = kernel.backend
                outputs = spec.outputs(kernel.forward(**sample.args), sample.args)
                for got, want in zip(outputs, spec.reference(sample.args), strict=True):
                    assert_matches(name, got, want, spec.tolerances[dtype])
                row.update(status="pass", detail="")
            except Exception as exc:  # every failure is a finding, never a crash
                culprit = origin(exc)
                if culprit is not None:
                    row.update(raised_by=culprit.backend, plugin=culprit.plugin)
                row.update(status="failure", detail=describe(exc))
            rows.append(row)
    return rows
