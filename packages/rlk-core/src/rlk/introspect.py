"""What users ask of the dispatcher: which backends exist, and which one a call would use."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from rlk.dispatch import Selection, current_policy, get_dispatcher
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
    """One record per known backend, with its status on `device` (default: see default_device)."""
    dispatcher = get_dispatcher()
    dispatcher.loader.ensure_loaded()
    target = default_device() if device is None else torch.device(device)
    records = []
    for backend in sorted(dispatcher.registry.backends.values(), key=lambda b: -b.priority):
        broken = [
            kernel.importable()
            for kernels in dispatcher.registry.kernels.values()
            for kernel in kernels
            if kernel.backend == backend.name
        ]
        failure = next((why for why in broken if why is not None), None)
        verdict = backend.probe_device(target)
        if failure is not None:
            status, reason = FAILED, failure
        elif verdict is not None:
            status, reason = UNAVAILABLE, verdict
        else:
            status, reason = READY, ""
        records.append(BackendInfo(backend.name, backend.distribution, backend.version,
                                   backend.priority, status, reason, backend.plugin))
    for record in dispatcher.loader.records:
        if record.status != "loaded":
            status = BLOCKED if record.status == "blocked" else FAILED
            records.append(BackendInfo(record.name, record.distribution, record.version, None,
                                       status, record.error, record.name))
    return records


def explain(op: str, *args: object, **kwargs: object) -> Selection:
    """The selection for `rlk.<op>(*args, **kwargs)` without running it.

    The result has `.backend`, `.kernel`, `.rejected` (backend -> reason) and `.plan`: the
    path the kernel will take, for kernels whose forward has a `plan(**kernel_args)`
    attribute (linear_policy_loss: 3 GEMMs or two passes).
    """
    from rlk.ops import specs

    known = specs()
    if op not in known:
        raise ValueError(f"unknown op {op!r}; rlk defines {sorted(known)}")
    spec = known[op]
    call = spec.prepare(*args, **kwargs)
    main = call[spec.main_input]
    dispatcher = get_dispatcher()
    selection = dispatcher.decide(op, main.device, main.dtype, call, current_policy(dispatcher))
    plan = None if selection.kernel is None else getattr(selection.kernel.forward, "plan", None)
    return selection if plan is None else dataclasses.replace(selection, plan=plan(**call))
