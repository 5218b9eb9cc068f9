"""What users ask of the dispatcher: which backends exist, and which one a call would use."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

import torch

from rlk._runtime.spec import OpSpec, specs
from rlk.dispatch import Dispatcher, Selection, get_dispatcher
from rlk.plugins import BLOCKED as BLOCKED_PLUGIN
from rlk.plugins import FAILED as FAILED_PLUGIN
from rlk.registry import BLOCKED, FAILED, READY, UNAVAILABLE


@dataclass(frozen=True)
class BackendInfo:
    """One known backend (or a plugin that failed before it could declare one)."""

    name: str
    distribution: str
    version: str
    priority: int | None
    status: str  # ready | unavailable | failed | blocked
    reason: str = ""
    plugin: str = ""


def default_device() -> torch.device:
    """The device introspection talks about when none is named: CUDA if torch sees one."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def backends(device: torch.device | str | None = None) -> list[BackendInfo]:
    """One record per known backend, with its status on `device` (default: see default_device).

    A backend is `failed` when a kernel of it cannot import or its probe raised (or broke
    the probe contract) on `device`, `unavailable` when its probe refused `device`.
    """
    dispatcher = get_dispatcher()
    dispatcher.loader.ensure_loaded()
    return backend_records(dispatcher, default_device() if device is None else torch.device(device))


def backend_records(dispatcher: Dispatcher, target: torch.device) -> list[BackendInfo]:
    """`backends()` for loaded plugins, without RLK_STRICT_PLUGINS' error (the doctor's view)."""
    records = []
    for backend in sorted(dispatcher.registry.backends.values(), key=lambda b: -b.priority):
        broken = [
            kernel.importable()
            for kernels in dispatcher.registry.kernels.values()
            for kernel in kernels
            if kernel.backend == backend.name
        ]
        failure = next((why for why in broken if why is not None), None)
        verdict = dispatcher.registry.probe(backend.name, target)
        if failure is not None:
            status, reason = FAILED, failure
        elif verdict.reason is not None:
            status, reason = (FAILED if verdict.failed else UNAVAILABLE), verdict.reason
        else:
            status, reason = READY, ""
        records.append(BackendInfo(backend.name, backend.distribution, backend.version,
                                   backend.priority, status, reason, backend.plugin))
    for record in dispatcher.loader.records:
        if record.status in (FAILED_PLUGIN, BLOCKED_PLUGIN):
            status = BLOCKED if record.status == BLOCKED_PLUGIN else FAILED
            records.append(BackendInfo(record.name, record.distribution, record.version, None,
                                       status, record.error, record.name))
    return records


def op_spec(op: str) -> OpSpec:
    """The spec of a dispatched op; a ValueError saying why for any other name."""
    known = specs()
    if op in known:
        return known[op]
    public = sys.modules["rlk"]  # the package this module belongs to, imported by now
    if op in public.__all__ and callable(getattr(public, op)):
        raise ValueError(f"rlk.{op} is not a dispatched op: no backend serves it, so there is "
                         f"nothing to explain (ops: {', '.join(known)})")
    raise ValueError(f"unknown op {op!r}; rlk defines {sorted(known)}")


def explain(op: str, *args: object, **kwargs: object) -> Selection:
    """The selection for `rlk.<op>(*args, **kwargs)` without running it.

    The result has `.backend`, `.kernel_name`, `.rejected` (backend -> reason), `.uses`
    (ops the chosen kernel dispatches itself: explain those for their backend) and `.plan`:
    the path the kernel will take, for kernels whose forward has a `plan(**kernel_args)`
    attribute (linear_policy_loss: 3 GEMMs or two passes).
    """
    spec = op_spec(op)
    call = spec.prepare(*args, **kwargs)
    selection = spec.select(call)
    if selection.kernel is None or not hasattr(selection.kernel.forward, "plan"):
        return selection
    if spec.operator is not None:  # the arguments as the chosen kernel will take them
        call = spec.operator.bound(spec.bind(selection.kernel), call)
    return dataclasses.replace(selection, plan=selection.kernel.forward.plan(**call))
