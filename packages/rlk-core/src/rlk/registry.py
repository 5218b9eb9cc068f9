"""What plugins declare: backends, and the kernels each provides for an op.

Each plugin's hook writes into a `Registry` of its own (`Registry.stage`): it sees only its
own declarations and which backend names other plugins took, so a plugin can neither
change nor hijack another's records. The loader merges a stage into the table the
dispatcher reads only once the whole hook has succeeded. Records are frozen.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from rlk.watchdog import warn_if_slow

Probe = Callable[[torch.device], "str | None"]
Check = Callable[..., "str | None"]

READY = "ready"
UNAVAILABLE = "unavailable"
FAILED = "failed"
BLOCKED = "blocked"


def split_target(target: str) -> tuple[str, str]:
    """Split "module:attr", refusing anything else at registration rather than at first call."""
    module_name, sep, attr = str(target).partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"kernel target must look like 'package.module:function', got {target!r}")
    return module_name, attr


def resolve(target: str) -> Any:
    """Import a "module:attr" target (attr may be dotted)."""
    module_name, attr = split_target(target)
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def as_names(what: str, value: object) -> tuple[str, ...]:
    """A collection of non-empty names; one string is one name (never its letters)."""
    items = (value,) if isinstance(value, str) else value
    if not isinstance(items, Iterable):
        raise TypeError(f"{what} must be a name or a collection of names, "
                        f"got {type(value).__name__}")
    found = tuple(items)
    for item in found:
        if not isinstance(item, str) or not item:
            raise TypeError(f"{what} must hold non-empty strings, got {item!r}")
    return found


def verdict(source: str, answer: object) -> str | None:
    """A probe's or check's answer: None accepts, a non-empty string is the reason.

    Anything else (False, "", 0, a tuple) breaks the contract: it is read as a refusal
    that says so, never as acceptance.
    """
    if answer is None or (isinstance(answer, str) and answer):
        return answer
    return (f"{source} returned {answer!r}, which the contract does not allow "
            "(None accepts; a non-empty string is the reason to refuse)")


@dataclass(frozen=True)
class Verdict:
    """A backend's probe result for one device: `reason` None means it serves the device.

    `failed` marks a probe that raised or broke its contract: the backend is broken there,
    not merely unavailable.
    """

    reason: str | None
    failed: bool = False


@dataclass(frozen=True)
class Backend:
    """One backend as a plugin declared it, with the plugin and distribution it came from."""

    name: str
    priority: int
    probe: Probe | None = None
    version: str = ""
    plugin: str = ""
    distribution: str = ""

    def run_probe(self, device: torch.device) -> Verdict:
        """The probe's verdict for `device`; a raising or malformed probe fails, never the host."""
        if self.probe is None:
            return Verdict(None)
        try:
            answer = self.probe(device)
        except Exception as exc:
            return Verdict(f"probe raised {type(exc).__name__}: {exc}", failed=True)
        reason = verdict("probe", answer)
        return Verdict(reason, failed=reason is not None and reason is not answer)


@dataclass(frozen=True, eq=False)
class Kernel:
    """A backend's implementation of one op, imported on first use.

    `uses` names the ops this kernel dispatches itself (native `linear_logp` runs its
    chunks through whichever backend serves `logp`), so explain and doctor can show it.
    """

    op: str
    backend: str
    target: str
    backward_target: str | None
    devices: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...] | None
    check: Check | None
    properties: frozenset[str]
    uses: tuple[str, ...] = ()
    plugin: str = ""
    distribution: str = ""
    _resolved: dict[str, Callable[..., Any]] = field(default_factory=dict, repr=False)

    @property
    def forward(self) -> Callable[..., Any]:
        if "forward" not in self._resolved:
            self._resolved["forward"] = resolve(self.target)
        return self._resolved["forward"]

    @property
    def backward(self) -> Callable[..., Any]:
        if "backward" not in self._resolved:
            if self.backward_target is None:
                raise NotImplementedError(
                    f"backend '{self.backend}' registered no backward for op '{self.op}' "
                    "(add_kernel(..., backward=...)). rlk declines such a kernel when an input "
                    "requires grad, but a call inside torch.compile cannot show that: prefer a "
                    "backend with a backward, e.g. rlk.use_backends('native')"
                )
            self._resolved["backward"] = resolve(self.backward_target)
        return self._resolved["backward"]

    def importable(self) -> str | None:
        """None when the kernel's functions import, else why not (shown by explain/doctor)."""
        try:
            self.forward  # noqa: B018 - importing is the point
            if self.backward_target is not None:
                self.backward  # noqa: B018
        except Exception as exc:
            return f"kernel {self.target} failed to import: {type(exc).__name__}: {exc}"
        return None


def _dtypes(value: object) -> tuple[torch.dtype, ...] | None:
    if value is None:
        return None
    items = (value,) if isinstance(value, torch.dtype) else value
    if not isinstance(items, Iterable) or isinstance(items, str):
        raise TypeError(f"dtypes must be torch dtypes, got {value!r}")
    found = tuple(items)
    for item in found:
        if not isinstance(item, torch.dtype):
            raise TypeError(f"dtypes must be torch dtypes (e.g. torch.float32), got {item!r}")
    return found


class Registry:
    """The table a plugin's `rlk_register` hook writes into (and, merged, the dispatcher's).

    A hook calls `add_backend` and then `add_kernel`, and may read `known_ops`; the other
    methods serve rlk's loader and dispatcher."""

    def __init__(self, known_ops: Iterable[str], *, plugin: str = "", distribution: str = "",
                 taken: Mapping[str, str] | None = None):
        self.known_ops = frozenset(known_ops)
        self.backends: dict[str, Backend] = {}
        self.kernels: dict[str, list[Kernel]] = {op: [] for op in self.known_ops}
        self._plugin = plugin
        self._distribution = distribution
        self._taken = dict(taken or {})  # backend name -> the plugin that declared it
        self._probes: dict[tuple[str, str], Verdict] = {}

    def add_backend(
        self,
        name: str,
        *,
        priority: int = 100,
        probe: Probe | None = None,
        version: str = "",
    ) -> None:
        """Declare a backend. Higher priority wins; `native` has 0."""
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"backend name must be an identifier, got {name!r}")
        owner = self._taken.get(name) or (self._plugin if name in self.backends else None)
        if owner is not None:
            raise ValueError(f"backend '{name}' is already registered by plugin "
                             f"'{owner or 'rlk'}'")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"priority must be an int, got {priority!r}")
        if probe is not None and not callable(probe):
            raise TypeError(f"probe must be a function of a torch.device, got {probe!r}")
        self.backends[name] = Backend(name=name, priority=priority, probe=probe,
                                      version=str(version), plugin=self._plugin,
                                      distribution=self._distribution)

    def add_kernel(
        self,
        op: str,
        backend: str,
        target: str,
        *,
        backward: str | None = None,
        devices: Iterable[str] = ("cpu", "cuda"),
        dtypes: Iterable[torch.dtype] | None = None,
        check: Check | None = None,
        properties: Iterable[str] = (),
        uses: Iterable[str] = (),
    ) -> None:
        """Register `target` ("module:function") as `backend`'s kernel for `op`."""
        if op not in self.known_ops:
            raise ValueError(f"unknown op {op!r}; rlk defines {sorted(self.known_ops)}")
        if backend not in self.backends:
            if backend in self._taken:
                raise ValueError(f"backend '{backend}' belongs to plugin '{self._taken[backend]}'; "
                                 "a plugin adds kernels only to the backends it declares")
            raise ValueError(f"add_backend('{backend}', ...) must come before its kernels")
        if any(k.backend == backend for k in self.kernels[op]):
            raise ValueError(f"backend '{backend}' already registered a kernel for '{op}'")
        split_target(target)
        if backward is not None:
            split_target(backward)
        if check is not None and not callable(check):
            raise TypeError(f"check must be a function of the kernel's arguments, got {check!r}")
        used = as_names("uses", uses)
        unknown = [name for name in used if name not in self.known_ops]
        if unknown:
            raise ValueError(f"uses names unknown ops {unknown}; rlk defines "
                             f"{sorted(self.known_ops)}")
        self.kernels[op].append(
            Kernel(
                op=op,
                backend=backend,
                target=target,
                backward_target=backward,
                devices=as_names("devices", devices),
                dtypes=_dtypes(dtypes),
                check=check,
                properties=frozenset(as_names("properties", properties)),
                uses=used,
                plugin=self._plugin,
                distribution=self._distribution,
            )
        )

    def stage(self, plugin: str, distribution: str) -> Registry:
        """An empty registry for one plugin's hook: it knows only which names others took."""
        taken = {name: backend.plugin for name, backend in self.backends.items()}
        return Registry(self.known_ops, plugin=plugin, distribution=distribution, taken=taken)

    def merge(self, stage: Registry) -> None:
        """Adopt everything a plugin's hook declared (only called once the hook succeeded)."""
        self.backends.update(stage.backends)
        for op, kernels in stage.kernels.items():
            self.kernels[op].extend(kernels)

    def clear(self) -> None:
        """Forget every declaration (an interrupted load starts again from nothing)."""
        self.backends.clear()
        for kernels in self.kernels.values():
            kernels.clear()
        self._probes.clear()

    def probe(self, name: str, device: torch.device) -> Verdict:
        """Backend `name`'s verdict for `device`, cached: probes must stay off the hot path."""
        key = (name, str(device))
        if key not in self._probes:
            backend = self.backends[name]
            with warn_if_slow(f"the probe of backend '{name}' on {device}",
                              _block_hint(backend.plugin)):
                self._probes[key] = backend.run_probe(device)
        return self._probes[key]


def _block_hint(plugin: str) -> str:
    return f"Block its plugin with RLK_DISABLE_PLUGINS={plugin}." if plugin else ""
