"""Finding, loading and registering backend plugins, each in isolation.

A plugin that fails must never break the host: its failure becomes a record that
`rlk.backends()` and `rlk-core doctor` show, and a WARNING logged once. Only
RLK_STRICT_PLUGINS=1 (used by CI) turns such failures into errors.
"""

from __future__ import annotations

import importlib
import logging
import threading
from dataclasses import dataclass
from importlib import metadata
from types import ModuleType
from typing import Any

import pluggy

from rlk.config import env_flag, env_names
from rlk.errors import PluginError
from rlk.registry import Registry

PROJECT = "rlk"
ENTRY_POINT_GROUP = "rlk.backends"
PLUGIN_API_VERSION = "1.0"
BUILTIN_PLUGINS = ("rlk.native.plugin",)

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)
log = logging.getLogger("rlk")


class _HookSpecs:
    @hookspec
    def rlk_register(self, registry: Registry) -> None:
        """Declare backends with `registry.add_backend` and kernels with `registry.add_kernel`."""


@dataclass(frozen=True)
class PluginRecord:
    """What happened to one plugin at load time."""

    name: str
    distribution: str
    version: str
    status: str  # "loaded", "failed" or "blocked"
    error: str = ""


def _api_mismatch(module: Any) -> str | None:
    declared = getattr(module, "RLK_PLUGIN_API", None)
    if declared is None:
        return f"declares no RLK_PLUGIN_API (rlk-core speaks {PLUGIN_API_VERSION})"
    major = str(declared).split(".")[0]
    if major != PLUGIN_API_VERSION.split(".")[0]:
        return f"written for plugin API {declared}, rlk-core speaks {PLUGIN_API_VERSION}"
    return None


class PluginLoader:
    """Loads every plugin once, lazily, into one registry."""

    def __init__(self, registry: Registry):
        self.registry = registry
        self.records: list[PluginRecord] = []
        self._manager = pluggy.PluginManager(PROJECT)
        self._manager.add_hookspecs(_HookSpecs)
        self._lock = threading.Lock()
        self._loaded = False

    def ensure_loaded(self) -> None:
        if self._loaded:
            return
        with self._lock:
            if self._loaded:
                return
            try:
                for module_name in BUILTIN_PLUGINS:
                    module = importlib.import_module(module_name)
                    self._register(module_name, module, "rlk-core", _core_version())
                for entry_point in _entry_points():
                    self._load_entry_point(entry_point)
            finally:  # even when strict mode raised: never register anything twice
                self._loaded = True

    def _load_entry_point(self, entry_point: metadata.EntryPoint) -> None:
        dist = entry_point.dist
        dist_name = dist.metadata["Name"] if dist is not None else ""
        dist_version = dist.version if dist is not None else ""
        only, disabled = env_names("RLK_PLUGINS"), env_names("RLK_DISABLE_PLUGINS")
        if entry_point.name in disabled or (only and entry_point.name not in only):
            why = "disabled by RLK_DISABLE_PLUGINS" if entry_point.name in disabled else (
                "not listed in RLK_PLUGINS"
            )
            self.records.append(
                PluginRecord(entry_point.name, dist_name, dist_version, "blocked", why)
            )
            return
        try:
            module = entry_point.load()
        except Exception as exc:
            error = f"import failed: {_describe(exc)}"
            self._fail(entry_point.name, dist_name, dist_version, error)
            return
        self._register(entry_point.name, module, dist_name, dist_version)

    def _register(self, name: str, module: ModuleType, dist: str, version: str) -> None:
        mismatch = _api_mismatch(module)
        if mismatch is not None:
            self._fail(name, dist, version, mismatch)
            return
        stage = self.registry.scoped(name, dist)
        try:
            self._manager.register(module, name=name)
            others = [p for p in self._manager.get_plugins() if p is not module]
            self._manager.subset_hook_caller("rlk_register", remove_plugins=others)(
                registry=stage
            )
        except Exception as exc:
            if self._manager.is_registered(module):
                self._manager.unregister(module)
            self._fail(name, dist, version, f"rlk_register failed: {_describe(exc)}")
            return
        self.registry.adopt(stage)
        self.records.append(PluginRecord(name, dist, version, "loaded"))

    def _fail(self, name: str, dist: str, version: str, error: str) -> None:
        self.records.append(PluginRecord(name, dist, version, "failed", error))
        if env_flag("RLK_STRICT_PLUGINS"):
            raise PluginError(f"plugin '{name}' ({dist} {version}): {error}")
        log.warning("rlk: plugin '%s' (%s %s) is unusable: %s", name, dist, version, error)


def _entry_points() -> list[metadata.EntryPoint]:
    return sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


def _core_version() -> str:
    from rlk import __version__

    return __version__


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
