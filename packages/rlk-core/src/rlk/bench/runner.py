"""Running the plan: every (workload, mode, shape) x implementation becomes one Row.

A row never takes the run down: a missing op, backend or package is `blocked`, an
allocation failure `oom`, anything else `failure` with the error, and the next row
starts from freed memory.
"""

from __future__ import annotations

import gc
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

import rlk
from rlk.bench import memory, progress, timing
from rlk.bench.ceilings import Ceilings
from rlk.bench.options import Options
from rlk.bench.row import BLOCKED, FAILURE, OOM, Row
from rlk.bench.workload import FORWARD_BACKWARD, Blocked, Call, Case, Error, Inputs, Peer, Workload
from rlk.errors import BackendUnavailableError

ROTATE_BYTES = 256 << 20  # rotate through at least this much input so caches cannot help
MAX_BUFFERS = 8
_OOM_TYPES: tuple[type[BaseException], ...] = (
    getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError), MemoryError)


@dataclass(frozen=True)
class Impl:
    """An rlk backend (`backend` set) or a peer (`peer` set); `blocked` is known up front."""

    name: str
    kind: str
    backend: str | None = None
    peer: Peer | None = None
    blocked: str | None = None
    env: tuple[tuple[str, str], ...] = ()  # set while the row runs (a backend's variant)


@dataclass(frozen=True)
class Group:
    workload: Workload
    mode: str
    case: Case
    dtype: torch.dtype
    impls: tuple[Impl, ...]


def _registered(op: str) -> list[str]:
    from rlk.dispatch import get_dispatcher

    dispatcher = get_dispatcher()
    dispatcher.loader.ensure_loaded()
    kernels = dispatcher.registry.kernels.get(op, [])
    priority = {name: b.priority for name, b in dispatcher.registry.backends.items()}
    return sorted({k.backend for k in kernels}, key=lambda name: -priority.get(name, 0))


def _backend_rows(workload: Workload, backend: str, device: torch.device) -> list[Impl]:
    """The backend's row, then one per variant of it (the same backend, another path)."""
    return [Impl(f"rlk:{backend}", "rlk", backend=backend)] + [
        Impl(f"rlk:{v.backend}-{v.name}", "rlk", backend=backend, blocked=v.unavailable(device),
             env=tuple(v.env.items()))
        for v in workload.variants if v.backend == backend]


def impls_for(workload: Workload, options: Options) -> list[Impl]:
    """rlk backends first (highest priority first), then the requested peers it has."""
    if workload.backends is not None:
        chosen = [b for b in workload.backends if options.backends is None
                  or b in options.backends]
    else:
        chosen = (list(options.backends) if options.backends is not None
                  else _registered(workload.op))
    impls = [impl for b in chosen for impl in _backend_rows(workload, b, options.device)]
    if not chosen and options.backends is None:
        impls.append(Impl("rlk", "rlk", blocked=f"no installed backend registers '{workload.op}'"))
    wanted = options.peers if options.peers is not None else list(workload.peers)
    impls += [Impl(name, "floor" if workload.peers[name].floor else "peer",
                   peer=workload.peers[name]) for name in wanted if name in workload.peers]
    return impls


def plan(workloads: list[Workload], options: Options) -> list[Group]:
    groups = []
    for workload in workloads:
        impls = tuple(impls_for(workload, options))
        cases = workload.smoke_cases if options.smoke else workload.cases
        groups += [Group(workload, mode, case, dtype, impls) for mode in workload.modes
                   for case in cases
                   for dtype in ([case.dtype] if case.dtype else options.sweep_dtypes)]
    return groups


@contextmanager
def _environ(values: Mapping[str, str]) -> Iterator[None]:
    """`values` in os.environ for the duration, the previous settings restored afterwards."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, _OOM_TYPES) or "out of memory" in str(exc).lower()


def _describe(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}"
    return text if len(text) <= 400 else text[:397] + "..."


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _nbytes(inputs: Inputs) -> int:
    return sum(v.nbytes for v in inputs.values() if isinstance(v, torch.Tensor))


class Runner:
    """Holds what every row of a run shares: options, device, dtype, ceilings, progress."""

    def __init__(self, options: Options, ceilings: Ceilings, bar: progress.Progress):
        self.options = options
        self.device = options.device
        self.ceilings = ceilings
        self.bar = bar
        self.budget = timing.SMOKE if options.smoke else timing.FULL
        self.deadline = (None if options.time_limit is None
                         else time.monotonic() + options.time_limit)

    def _out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    def run(self, groups: list[Group]) -> Iterator[Row]:
        for group in groups:
            yield from self._group(group)

    # -- one (workload, mode, case): inputs and reference shared by its rows

    def _group(self, group: Group) -> Iterator[Row]:
        backward = group.mode == FORWARD_BACKWARD
        dtype = group.dtype
        buffers: list[Inputs] = []
        failed: tuple[str, str] | None = None
        try:
            if self._out_of_time():
                raise TimeoutError
            buffers = self._buffers(group, dtype, backward)
        except TimeoutError:
            failed = (BLOCKED, f"not run: the --time-limit of {self.options.time_limit:g} s "
                               "was spent")
        except Blocked as exc:  # the workload itself cannot run here (a framework is missing)
            failed = (BLOCKED, str(exc))
        except Exception as exc:
            failed = (OOM if _is_oom(exc) else FAILURE, "making the inputs: " + _describe(exc))
        expected, checked = (None, "") if failed else self._reference(group, buffers[0], backward)
        for impl in group.impls:
            row = self._blank(group, impl, dtype)
            self.bar.start(f"{group.workload.name} {group.mode} {group.case.label} {impl.name}")
            if failed is None and self._out_of_time():
                failed = (BLOCKED, f"not run: the --time-limit of {self.options.time_limit:g} s "
                                   "was spent")
            if failed is not None:
                row.status, row.reason = failed
            else:
                row.checked = checked
                self._row(row, group, impl, buffers, expected, backward)
                _free(self.device)
            self.bar.done(row.status)
            yield row
        del buffers, expected
        _free(self.device)

    def _buffers(self, group: Group, dtype: torch.dtype, backward: bool) -> list[Inputs]:
        def make(seed: int) -> Inputs:
            return group.workload.inputs(group.case, dtype, self.device, seed, backward)

        first = make(0)
        size = max(_nbytes(first), 1)
        count = 2 if self.options.smoke else min(MAX_BUFFERS, math.ceil(ROTATE_BYTES / size))
        return [first] + [make(seed) for seed in range(1, count)]

    def _reference(self, group: Group, inputs: Inputs, backward: bool) -> tuple[Any, str]:
        try:
            expected = group.workload.reference(inputs, backward)
        except Exception as exc:
            what = "did not fit" if _is_oom(exc) else "failed"
            return None, f"not checked: the float64 reference {what} ({_describe(exc)})"
        if expected is None:
            op = group.workload.op
            return None, f"not checked: this rlk-core has no float64 reference for {op}"
        rows = inputs.get("check_rows")
        return expected, "all rows" if rows is None else f"{rows.numel()} rows"

    def _blank(self, group: Group, impl: Impl, dtype: torch.dtype) -> Row:
        cost = group.workload.cost(group.case, dtype, group.mode == FORWARD_BACKWARD)
        roofline, bound = self.ceilings.roofline_ms(cost.bytes, cost.flops,
                                                    str(dtype).replace("torch.", ""))
        return Row(workload=group.workload.name, op=group.workload.op, mode=group.mode,
                   case=group.case.label, dims=dict(group.case.dims),
                   dtype=str(dtype).replace("torch.", ""), device=str(self.device),
                   impl=impl.name, kind=impl.kind, bytes_moved=cost.bytes, flops=cost.flops,
                   bound=bound, roofline_ms=roofline,
                   note=impl.peer.note if impl.peer is not None else "")

    # -- one row

    def _row(self, row: Row, group: Group, impl: Impl, buffers: list[Inputs], expected: Any,
             backward: bool) -> None:
        if impl.blocked is not None:
            row.status, row.reason = BLOCKED, impl.blocked
            return
        try:
            with self._scope(impl):
                self._measure(row, group, impl, buffers, expected, backward)
        except Blocked as exc:
            row.status, row.reason = BLOCKED, str(exc)
        except BackendUnavailableError as exc:
            row.status = BLOCKED
            row.reason = exc.reasons.get(impl.backend or "", "") or _describe(exc)
        except Exception as exc:
            row.status = OOM if _is_oom(exc) else FAILURE
            row.reason = _describe(exc)

    def _scope(self, impl: Impl) -> AbstractContextManager[Any]:
        if impl.backend is None:
            return nullcontext()
        scope = ExitStack()
        scope.enter_context(rlk.use_backends(impl.backend, strict=True))
        scope.enter_context(_environ(dict(impl.env)))
        return scope

    def _build(self, group: Group, impl: Impl, backward: bool) -> Call:
        if impl.peer is not None:
            return impl.peer.build(group.case, backward, self.device)
        return group.workload.rlk_call(backward)

    def _measure(self, row: Row, group: Group, impl: Impl, buffers: list[Inputs], expected: Any,
                 backward: bool) -> None:
        call = self._build(group, impl, backward)
        mutated = impl.peer.mutates if (impl.peer is not None and backward) else ()
        setup: Callable[[int], None] | None = None
        if mutated:
            buffers = buffers[:1]  # restored before every call instead of rotated
            pristine = {name: buffers[0][name].detach().clone() for name in mutated}

            def setup(i: int) -> None:
                with torch.no_grad():
                    for name, saved in pristine.items():
                        buffers[0][name].copy_(saved)

        try:
            self._time(row, group, call, buffers, expected, setup)
        finally:
            if setup is not None:  # the rows after this one need the inputs intact
                setup(0)

    def _time(self, row: Row, group: Group, call: Call, buffers: list[Inputs], expected: Any,
              setup: Callable[[int], None] | None) -> None:
        def run_on(i: int) -> object:
            return call(buffers[i % len(buffers)])

        if setup is not None:
            setup(0)
        _, row.first_call_ms = timing.wall_ms(lambda: run_on(0), self.device)
        if setup is not None:
            setup(0)
        outputs, row.extra_memory_bytes, row.memory_method = memory.extra(
            lambda: call(buffers[0]), self.device)
        if expected is not None:
            self._check(row, group, group.workload.compare(expected, outputs, buffers[0]))
        del outputs
        measured = timing.measure(run_on, self.budget, self.device, setup)
        row.time_ms, row.time_min_ms, row.reps = measured.median_ms, measured.min_ms, measured.reps
        if row.roofline_ms is not None and measured.median_ms > 0:
            row.roofline_pct = 100.0 * row.roofline_ms / measured.median_ms

    def _check(self, row: Row, group: Group, errors: list[Error]) -> None:
        """Record errors; fail a row that returns impossible values or misses rlk's tolerance."""
        values = [e for e in errors if e.name != "tokens"]
        row.errors = {e.name: e.max_abs for e in values}
        forward = [e.max_abs for e in values if not e.name.startswith("grad_")]
        backward = [e.max_abs for e in values if e.name.startswith("grad_")]
        row.max_abs_error = max(forward) if forward else None
        row.grad_max_abs_error = max(backward) if backward else None
        problems = [f"{e.invalid} sampled tokens outside the float64 top-k/top-p set"
                    for e in errors if e.invalid]
        problems += [f"{e.name} is not finite where the float64 reference is"
                     for e in values if math.isinf(e.max_abs)]
        if row.kind == "rlk":
            problems += self._beyond_tolerance(group.workload.op, row.dtype, values)
        if problems:
            row.status, row.reason = FAILURE, "; ".join(problems)

    def _beyond_tolerance(self, op: str, dtype: str, errors: list[Error]) -> list[str]:
        from rlk._runtime.spec import specs

        spec = specs().get(op)
        if spec is None:
            return []
        key = getattr(torch, dtype)
        found = []
        for e in errors:
            table = spec.grad_tolerances if e.name.startswith("grad_") else spec.tolerances
            tol = (table or {}).get(key)
            if tol is not None and e.max_abs > tol.atol + tol.rtol * e.max_ref:
                found.append(f"{e.name} error {e.max_abs:.3g} exceeds the spec tolerance "
                             f"(atol {tol.atol:g} + rtol {tol.rtol:g} x {e.max_ref:.3g})")
        return found
