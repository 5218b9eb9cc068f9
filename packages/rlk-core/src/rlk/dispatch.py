"""Choosing a backend's kernel for each call.

The decision depends only on (op, device, main dtype, the op's flags, whether an input
requires grad, the user's policy), so it is made once per such key and cached: the
steady-state cost of a call is one dict lookup. Every rejected candidate keeps its reason,
for `rlk.explain`, `rlk-core doctor` and `BackendUnavailableError`.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import FrameType
from typing import Any, TypeVar

import torch

from rlk.config import env_flag, env_names
from rlk.errors import BackendUnavailableError
from rlk.names import did_you_mean, listing
from rlk.op_table import OP_NAMES
from rlk.plugins import (
    BLOCKED,
    DUPLICATE,
    FAILED,
    PluginLoader,
    failed_plugins,
    misplaced_entry_points,
)
from rlk.registry import Kernel, Registry, as_names, verdict

log = logging.getLogger("rlk")
Bound = TypeVar("Bound")


@dataclass(frozen=True)
class Policy:
    """The user's wishes: preference order, strictness, required kernel properties."""

    order: tuple[str, ...] = ()
    strict: bool = False
    require: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Selection:
    """The outcome of selection for one call: the kernel chosen and every rejection.

    `uses` names the ops the chosen kernel dispatches itself (their own selections decide
    which backend runs them).
    """

    op: str
    device: str
    backend: str | None
    kernel: Kernel | None
    rejected: Mapping[str, str] = field(default_factory=dict)  # every other backend: why not
    plan: str | None = None  # how the kernel will run the call, when it says (`explain`)
    outranked: tuple[str, ...] = ()  # backends in `rejected` that could serve, ranked lower

    @property
    def kernel_name(self) -> str | None:
        return None if self.kernel is None else self.kernel.target

    @property
    def uses(self) -> tuple[str, ...]:
        return () if self.kernel is None else self.kernel.uses


class Dispatcher:
    """Registry, plugin loader and selection cache, created lazily on first use."""

    def __init__(self, known_ops: Iterable[str]):
        self.registry = Registry(known_ops)
        self.loader = PluginLoader(self.registry)
        self.env_policy = Policy(
            order=env_names("RLK_BACKENDS"), strict=env_flag("RLK_STRICT")
        )
        self._cache: dict[tuple[Any, ...], Any] = {}
        self._warned: set[tuple[str, ...]] = set()
        self._lock = threading.Lock()

    def kernel_for(self, op: str, device: torch.device, dtype: torch.dtype,
                   flags: tuple[Any, ...], args: Mapping[str, Any], needs_grad: bool,
                   bind: Callable[[Kernel], Bound]) -> Bound:
        """The kernel to run, bound to its op's contract; raises BackendUnavailableError when
        none may run. `needs_grad`: an input of the call requires grad."""
        policy = current_policy(self)
        key = (op, device.type, device.index, dtype, flags, needs_grad, policy)
        found = self._cache.get(key)
        if found is not None:
            return found
        self.loader.ensure_loaded()
        selection = self.decide(op, device, dtype, args, policy, needs_grad)
        if selection.kernel is None:
            detail = " (strict mode)" if self._strict_binds(op, policy) else ""
            raise BackendUnavailableError(op, str(device), selection.rejected, detail)
        self._log_fallback(selection, policy)
        bound = bind(selection.kernel)
        if self.loader.loaded:  # a plugin calling rlk while it loads saw part of the table
            with self._lock:
                self._cache[key] = bound
        return bound

    def decide(self, op: str, device: torch.device, dtype: torch.dtype,
               args: Mapping[str, Any], policy: Policy, needs_grad: bool = False) -> Selection:
        """Rank the candidates for one call and take the first that accepts it.

        Loads plugins if needed, but leaves RLK_STRICT_PLUGINS' error to the callers that
        want it (op calls, explain): the doctor decides in spite of failed plugins.
        """
        self.loader.load()
        self._warn_unknown(policy)
        binds = self._strict_binds(op, policy)
        rejected: dict[str, str] = {}
        outranked = []
        chosen: Kernel | None = None
        for kernel in self._ranked(op, policy):
            reason = self._reject_reason(kernel, device, dtype, args, policy, binds, needs_grad)
            if reason is None and chosen is None:
                chosen = kernel
                continue
            if reason is None:
                assert chosen is not None
                reason = f"could serve this call, but {self._ranks_below(kernel, chosen, policy)}"
                outranked.append(kernel.backend)
            rejected[kernel.backend] = reason
        serving = {k.backend for k in self.registry.kernels[op]}
        for name in self.registry.backends:
            if name not in serving:
                rejected[name] = f"registers no '{op}' kernel"
        for name in policy.order:
            if name not in self.registry.backends:
                rejected[name] = self.missing(name)
        backend = None if chosen is None else chosen.backend
        return Selection(op, str(device), backend, chosen, rejected, outranked=tuple(outranked))

    def _ranks_below(self, kernel: Kernel, chosen: Kernel, policy: Policy) -> str:
        if chosen.backend in policy.order:
            return f"'{chosen.backend}' comes first in the backend preference"
        mine = self.registry.backends[kernel.backend].priority
        theirs = self.registry.backends[chosen.backend].priority
        if mine == theirs:
            return f"'{chosen.backend}' has the same priority ({mine}) and registered first"
        return f"'{chosen.backend}' has a higher priority ({theirs} > {mine})"

    def missing(self, name: str) -> str:
        """Why no backend called `name` is registered: its plugin's recorded cause if any."""
        record = next((r for r in self.loader.records if r.name == name), None)
        if record is not None and record.status in (FAILED, BLOCKED, DUPLICATE):
            where = f"{record.distribution} {record.version}".strip()
            verb = {FAILED: "failed to load", BLOCKED: "is blocked",
                    DUPLICATE: "was skipped"}[record.status]
            return f"not installed: plugin '{name}' ({where or 'no distribution'}) {verb}: " \
                   f"{record.error}"
        failed = failed_plugins(self.loader.records)
        also = f"; plugins that failed to load: {', '.join(failed)}" if failed else ""
        also += "".join(f"; {line}" for point, line in misplaced_entry_points() if point == name)
        return (f"not installed: no plugin registered a backend '{name}' (backends: "
                f"{listing(self.registry.backends)}){did_you_mean(name, self.registry.backends)}"
                f"{also}")

    def probe(self, backend: str, device: torch.device) -> str | None:
        """The reason `backend` cannot serve `device`, or None (cached per device)."""
        return self.registry.probe(backend, device).reason

    def _ranked(self, op: str, policy: Policy) -> list[Kernel]:
        backends = self.registry.backends

        def rank(kernel: Kernel) -> tuple[int, int]:
            pos = policy.order.index(kernel.backend) if kernel.backend in policy.order else None
            return (len(policy.order) if pos is None else pos, -backends[kernel.backend].priority)

        return sorted(self.registry.kernels[op], key=rank)

    def _reject_reason(self, kernel: Kernel, device: torch.device, dtype: torch.dtype,
                       args: Mapping[str, Any], policy: Policy, binds: bool,
                       needs_grad: bool) -> str | None:
        if binds and not self._strict_allows(kernel, policy):
            return "strict mode allows only " + (
                ", ".join(policy.order) if policy.order else "the highest-priority backend"
            )
        if device.type not in kernel.devices:
            return f"serves {'/'.join(kernel.devices)} devices, not {device.type}"
        if kernel.dtypes is not None and dtype not in kernel.dtypes:
            takes = ", ".join(str(d).replace("torch.", "") for d in kernel.dtypes)
            return f"does not take {str(dtype).replace('torch.', '')} (takes {takes})"
        missing = policy.require - kernel.properties
        if missing:
            return "lacks required propert" + ("y " if len(missing) == 1 else "ies ") + ", ".join(
                sorted(missing)
            )
        reason = self.probe(kernel.backend, device)
        if reason is not None:
            return reason
        broken = kernel.importable()
        if broken is not None:
            return broken
        if needs_grad and kernel.backward_target is None:
            return ("registers no backward and an input requires grad (detach the inputs to "
                    "use this kernel)")
        if kernel.check is not None:
            try:
                return verdict("check", kernel.check(**args))
            except Exception as exc:
                return f"check raised {type(exc).__name__}: {exc}"
        return None

    def _strict_binds(self, op: str, policy: Policy) -> bool:
        """Whether strict mode constrains `op`. It does unless every backend the policy names
        is installed and none of them implements `op`: requiring a backend for the ops it
        serves leaves the others to their usual backends."""
        if not policy.strict:
            return False
        if not policy.order:
            return True
        serving = {k.backend for k in self.registry.kernels[op]}
        return any(name in serving or name not in self.registry.backends
                   for name in policy.order)

    def _strict_allows(self, kernel: Kernel, policy: Policy) -> bool:
        if policy.order:
            return kernel.backend in policy.order
        top = max(self.registry.kernels[kernel.op],
                  key=lambda k: self.registry.backends[k.backend].priority)
        return kernel is top

    def _warn_unknown(self, policy: Policy) -> None:
        """Warn once per backend or property name a policy holds that nothing registered."""
        for name in policy.order:
            if name not in self.registry.backends:
                self._warn_once(("backend", name), "rlk: the backend preference names '%s', "
                                "which is %s", name, self.missing(name))
        known = {p for kernels in self.registry.kernels.values() for k in kernels
                 for p in k.properties}
        for prop in sorted(policy.require - known):
            self._warn_once(("property", prop), "rlk: require= names property '%s', which no "
                            "kernel declares (properties: %s)%s", prop, listing(known),
                            did_you_mean(prop, known))

    def _warn_once(self, key: tuple[str, ...], message: str, *values: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *values)

    def _log_fallback(self, selection: Selection, policy: Policy) -> None:
        """Log once per (op, backend, reason) when a better-ranked backend was passed over.

        A backend whose kernel does not serve the device type at all is no fallback, nor
        is one that strict mode excluded: the user asked for exactly that.
        """
        assert selection.kernel is not None
        device_type = torch.device(selection.device).type
        chosen_priority = self.registry.backends[selection.kernel.backend].priority
        binds = self._strict_binds(selection.op, policy)
        for kernel in self.registry.kernels[selection.op]:
            reason = selection.rejected.get(kernel.backend)
            if (reason is None or device_type not in kernel.devices
                    or kernel.backend in selection.outranked):
                continue
            if binds and not self._strict_allows(kernel, policy):
                continue
            if self.registry.backends[kernel.backend].priority <= chosen_priority:
                continue
            self._warn_once(("fallback", selection.op, kernel.backend, reason),
                            "rlk: '%s' falls back from backend '%s' to '%s': %s",
                            selection.op, kernel.backend, selection.backend, reason)


@dataclass(frozen=True)
class _SuspendableScope:
    """A `use_backends` scope entered inside a generator or coroutine.

    Generators run in their caller's context, so a context variable set inside one stays
    set in the caller while the generator is suspended. This scope holds only while the
    frame that entered it is running (on the current stack); otherwise the scope outside it
    applies, as it would if the generator had its own context.
    """

    policy: Policy
    frame: FrameType
    outer: Policy | _SuspendableScope | None


# what `use_backends` scopes set: a Policy, a generator's scope, or None (the environment's)
_policy: contextvars.ContextVar[Policy | _SuspendableScope | None] = contextvars.ContextVar(
    "rlk_policy", default=None)
_SUSPENDABLE = (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
                | inspect.CO_ITERABLE_COROUTINE)


def _effective(scoped: Policy | _SuspendableScope | None) -> Policy | None:
    """The policy in force: generator scopes whose frame is suspended do not count."""
    while isinstance(scoped, _SuspendableScope):
        if _running(scoped.frame):
            return scoped.policy
        scoped = scoped.outer
    return scoped


def _unlinked(scoped: Policy | _SuspendableScope | None, entered: _SuspendableScope
              ) -> tuple[bool, Policy | _SuspendableScope | None]:
    """Whether `scoped` holds the innermost generator scope of `entered`'s frame and policy,
    and `scoped` without it. Generators suspended inside their scopes interleave: one leaving
    its scope must keep the scopes other generators entered after it, which a reset of the
    context variable (to its value before this scope) would drop."""
    if not isinstance(scoped, _SuspendableScope):
        return False, scoped
    if scoped.frame is entered.frame and scoped.policy is entered.policy:
        return True, scoped.outer
    found, outer = _unlinked(scoped.outer, entered)
    return found, replace(scoped, outer=outer) if found else scoped


def _running(frame: FrameType) -> bool:
    current: FrameType | None = sys._getframe(1)
    while current is not None:
        if current is frame:
            return True
        current = current.f_back
    return False


class ScopedPolicy:
    """`with ScopedPolicy(policy):` re-enters a policy captured earlier with
    `captured_policy()` (None: the environment's). A class, not a generator context manager:
    every eager backward enters one, and this costs a fifth of contextlib's host time."""

    __slots__ = ("_policy", "_token")

    def __init__(self, policy: Policy | None):
        self._policy = policy

    def __enter__(self) -> None:
        self._token = _policy.set(self._policy)

    def __exit__(self, *exc: object) -> None:
        _policy.reset(self._token)


def captured_policy() -> Policy | None:
    """The scoped policy in force now, for re-entering later (see ScopedPolicy)."""
    return _effective(_policy.get())


def current_policy(dispatcher: Dispatcher) -> Policy:
    scoped = _policy.get()
    if type(scoped) is _SuspendableScope:  # every call reads this: no call unless needed
        scoped = _effective(scoped)
    return dispatcher.env_policy if scoped is None else scoped  # type: ignore[return-value]


class use_backends:  # a lowercase class: used like a function, `with rlk.use_backends(...):`
    """Scope a backend preference: `with rlk.use_backends("cuda", strict=True): ...`.

    Names come first in that order; unnamed backends keep their priority after them.
    `strict=True` raises instead of falling back outside the named backends (or, with no
    names, below the highest-priority backend), for the ops a named backend implements
    (every op, when a named backend is not installed); `require` keeps only kernels with
    those properties (one name or several, e.g. "batch_invariant"). Scopes nest; the
    inner one wins. A scope entered inside a generator (or coroutine) holds only while it
    runs: the caller does not see it while the generator is suspended. (As for any context
    variable, a scope the caller enters around a later `next()` is the inner one there.)
    """

    __slots__ = ("_entered", "_names", "_require", "_strict", "_token")

    def __init__(self, *names: str, strict: bool | None = None,
                 require: str | Iterable[str] = ()):
        for name in names:
            if not isinstance(name, str) or not name:
                raise TypeError(f"backend names must be non-empty strings, got {name!r}")
        if strict is not None and not isinstance(strict, bool):
            raise TypeError(f"strict must be True, False or None (keep the outer setting), "
                            f"got {strict!r}")
        self._names, self._strict = names, strict
        self._require = frozenset(as_names("require", require))

    def __enter__(self) -> Policy:
        scoped = _policy.get()
        outer = _effective(scoped) or get_dispatcher().env_policy
        policy = Policy(
            order=self._names or outer.order,
            strict=outer.strict if self._strict is None else self._strict,
            require=self._require | outer.require,
        )
        frame = sys._getframe(1)
        entered: Policy | _SuspendableScope = policy
        if frame.f_code.co_flags & _SUSPENDABLE:
            entered = _SuspendableScope(policy, frame, scoped)
        self._entered, self._token = entered, _policy.set(entered)
        return policy

    def __exit__(self, *exc: object) -> None:
        if isinstance(self._entered, _SuspendableScope):
            found, rest = _unlinked(_policy.get(), self._entered)
            if found:
                _policy.set(rest)
                return
        _policy.reset(self._token)


_dispatcher: Dispatcher | None = None
_dispatcher_lock = threading.Lock()


def get_dispatcher() -> Dispatcher:
    global _dispatcher
    if _dispatcher is None:
        with _dispatcher_lock:
            if _dispatcher is None:
                _dispatcher = Dispatcher(OP_NAMES)
    return _dispatcher


def _after_fork_in_child() -> None:
    """Locks held by threads that do not exist in a forked child start free there."""
    global _dispatcher_lock
    _dispatcher_lock = threading.Lock()
    if _dispatcher is not None:
        _dispatcher._lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


def reset() -> None:
    """Forget plugins, environment settings and cached decisions (tests use this)."""
    global _dispatcher
    with _dispatcher_lock:
        _dispatcher = None
