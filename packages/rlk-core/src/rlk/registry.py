"""What plugins register: backends and the kernels they provide for each op."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

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


@dataclass
class Backend:
    """One backend as a plugin declared it, plus what the loader learnt about it."""

    name: str
    priority: int
    probe: Probe | None = None
    version: str = ""
    plugin: str = ""
    distribution: str = ""
    _probes: dict[str, str | None] = field(default_factory=dict, repr=False)

    def probe_device(self, device: torch.device) -> str | None:
        """The probe's verdict for a device, cached: probes must stay off the hot path."""
        key = str(device)
        if key not in self._probes:
            if self.probe is None:
                verdict = None
            else:
                try:
                    verdict = self.probe(device)
                except Exception as exc:  # a broken probe must not break the host
                    verdict = f"probe raised {type(exc).__name__}: {exc}"
            self._probes[key] = verdict
        return self._probes[key]


@dataclass
class Kernel:
    """A backend's implementation of one op, imported on first use."""

    op: str
    backend: str
    target: str
    backward_target: str | None
    devices: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...] | None
    check: Check | None
    properties: frozenset[str]
    _forward: Callable[..., Any] | None = field(default=None, repr=False)
    _backward: Callable[..., Any] | None = field(default=None, repr=False)

    @property
    def forward(self) -> Callable[..., Any]:
        if self._forward is None:
            self._forward = resolve(self.target)
        return self._forward

    @property
    def backward(self) -> Callable[..., Any]:
        if self._backward is None:
            if self.backward_target is None:
                raise NotImplementedError(
                    f"backend '{self.backend}' registered no backward for op '{self.op}'"
                )
            self._backward = resolve(self.backward_target)
        return self._backward

    def importable(self) -> str | None:
        """None when the kernel's functions import, else why not (shown by explain/doctor)."""
        try:
            self.forward  # noqa: B018 - importing is the point
            if self.backward_target is not None:
                self.backward  # noqa: B018
        except Exception as exc:
            return f"kernel {self.target} failed to import: {type(exc).__name__}: {exc}"
        return None


class Registry:
    """The table every plugin's `rlk_register` hook writes into."""

    def __init__(self, known_ops: Iterable[str]):
        self.known_ops = frozenset(known_ops)
        self.backends: dict[str, Backend] = {}
        self.kernels: dict[str, list[Kernel]] = {op: [] for op in self.known_ops}
        self._plugin = ""
        self._distribution = ""

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
        if name in self.backends:
            owner = self.backends[name].plugin or "rlk"
            raise ValueError(f"backend '{name}' is already registered by plugin '{owner}'")
        if not isinstance(priority, int):
            raise TypeError(f"priority must be an int, got {type(priority).__name__}")
        self.backends[name] = Backend(
            name=name,
            priority=priority,
            probe=probe,
            version=str(version),
            plugin=self._plugin,
            distribution=self._distribution,
        )

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
    ) -> None:
        """Register `target` ("module:function") as `backend`'s kernel for `op`."""
        if op not in self.known_ops:
            raise ValueError(f"unknown op {op!r}; rlk defines {sorted(self.known_ops)}")
        if backend not in self.backends:
            raise ValueError(f"add_backend('{backend}', ...) must come before its kernels")
        if any(k.backend == backend for k in self.kernels[op]):
            raise ValueError(f"backend '{backend}' already registered a kernel for '{op}'")
        split_target(target)
        if backward is not None:
            split_target(backward)
        self.kernels[op].append(
            Kernel(
                op=op,
                backend=backend,
                target=target,
                backward_target=backward,
                devices=tuple(devices),
                dtypes=None if dtypes is None else tuple(dtypes),
                check=check,
                properties=frozenset(properties),
            )
        )

    def scoped(self, plugin: str, distribution: str) -> Registry:
        """A staging registry for one plugin: merged only if its hook succeeds."""
        stage = Registry(self.known_ops)
        stage.backends = dict(self.backends)
        stage.kernels = {op: list(ks) for op, ks in self.kernels.items()}
        stage._plugin = plugin
        stage._distribution = distribution
        return stage

    def adopt(self, stage: Registry) -> None:
        self.backends = stage.backends
        self.kernels = stage.kernels
