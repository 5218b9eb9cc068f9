"""Finding, loading and registering backend plugins: each in isolation, all of them once.

A plugin that fails never breaks the host nor stops another plugin from loading: it
becomes a record that `rlk.backends()` and `rlk-core doctor` show, and a WARNING. Each
plugin's hook writes into a registry of its own, merged only if the whole hook returns.
Loading is all or nothing for the process: if it is interrupted (Ctrl-C), what it did is
forgotten, the interrupt propagates and the next call loads again. RLK_STRICT_PLUGINS=1
(CI) makes every call raise PluginError while a plugin is failed.

The lock is re-entrant: a plugin that calls rlk while it loads sees the plugins loaded
before it, and the dispatcher caches nothing decided before loading ends.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from importlib import import_module, metadata
from typing import Any

import pluggy

from rlk import api_versions
from rlk.config import env_flag, env_names
from rlk.errors import PluginError, describe
from rlk.hookspec import PROJECT, HookSpecs
from rlk.names import did_you_mean, listing
from rlk.registry import Registry
from rlk.version import __version__
from rlk.watchdog import warn_if_slow

ENTRY_POINT_GROUP = "rlk.backends"
_LOADERS: weakref.WeakSet[PluginLoader] = weakref.WeakSet()
BUILTIN_PLUGINS = ("rlk.native",)
FORK_WAIT_S = 30.0  # how long os.fork() waits for another thread's plugin load to end
LOADED, FAILED, BLOCKED, DUPLICATE = "loaded", "failed", "blocked", "duplicate"
# what importlib can load: a dotted module, optionally ":attr.path", optionally "[extras]"
_VALID_TARGET = re.compile(r"^\s*[\w.]+\s*(:\s*[\w.]+\s*)?(\[[^\]]*\])?\s*$")
log = logging.getLogger("rlk")
_FAILED = object()  # what a failed attempt returns


@dataclass(frozen=True)
class PluginRecord:
    """What happened to one plugin at load time."""

    name: str
    distribution: str
    version: str
    status: str  # loaded | failed | blocked | duplicate
    error: str = ""
    target: str = ""  # the entry point's value: the module (or object) it names
    api: str = ""  # the RLK_PLUGIN_API it declares ("" until imported, or if none)
    backends: tuple[str, ...] = ()  # the backends its hook declared


class PluginLoader:
    """Loads every plugin once, lazily, into one registry."""

    def __init__(self, registry: Registry):
        self.registry = registry
        self.records: list[PluginRecord] = []
        self._lock = threading.RLock()
        self._loaded = False
        self._loading_thread: int | None = None  # the thread running _load_all, if one is
        self._held_for_fork = False
        _LOADERS.add(self)

    @property
    def loaded(self) -> bool:
        """True once every plugin is loaded or recorded (and while none is loading)."""
        return self._loaded

    def ensure_loaded(self) -> None:
        """Load once; with RLK_STRICT_PLUGINS=1 raise PluginError while any plugin failed."""
        self.load()
        if env_flag("RLK_STRICT_PLUGINS"):
            failed = [r for r in self.records if r.status == FAILED]
            if failed:
                lines = [f"  plugin '{r.name}' ({r.distribution} {r.version}): {r.error}"
                         for r in failed]
                names = ",".join(r.name for r in failed)
                raise PluginError("\n".join([
                    "rlk plugins failed to load (RLK_STRICT_PLUGINS=1 makes this an error):",
                    *lines,
                    f"fix or uninstall them, or block them with RLK_DISABLE_PLUGINS={names}",
                ]))

    def load(self) -> None:
        """Load every plugin, unless done or in progress on this thread; never raises for a
        plugin's sake (only an interrupt or a bug in rlk propagates, undoing the load)."""
        if self._loaded:
            return
        with self._lock:
            if self._loaded or self._loading_thread is not None:
                return
            self._loading_thread = threading.get_ident()
            try:
                self._load_all()
            except BaseException:
                self._forget()
                raise
            finally:
                self._loading_thread = None
            self._loaded = True
        for warning in self.unknown_filters():
            log.warning("rlk: %s", warning)

    def _forget(self) -> None:
        self.registry.clear()
        self.records = []

    def before_fork(self) -> None:
        """Let a load another thread is running end first (FORK_WAIT_S at most): a child
        forked mid-load would inherit Python's lock on the module being imported, held by a
        thread it does not have, and hang at its first import of that module."""
        self._held_for_fork = self._lock.acquire(timeout=FORK_WAIT_S)

    def after_fork_in_parent(self) -> None:
        if self._held_for_fork:
            self._held_for_fork = False
            self._lock.release()

    def after_fork_in_child(self) -> None:
        """A forked child has only the thread that forked. A load running on it goes on in
        the child, lock and all. Otherwise the child gets a free lock and, where the wait
        for another thread's load ran out, nothing loaded: it loads again."""
        held, self._held_for_fork = self._held_for_fork, False
        if self._loading_thread == threading.get_ident():
            if held:
                self._lock.release()
            return
        self._lock = threading.RLock()
        if self._loading_thread is not None:
            self._loading_thread = None
            self._forget()

    def unknown_filters(self) -> list[str]:
        """RLK_PLUGINS / RLK_DISABLE_PLUGINS names that match no plugin's entry point."""
        known = {r.name for r in self.records}
        by_distribution = {_normal(r.distribution): r.name for r in self.records if r.distribution}
        by_backend = {b: r.name for r in self.records for b in r.backends}
        found = []
        for control in ("RLK_PLUGINS", "RLK_DISABLE_PLUGINS"):
            for name in env_names(control):
                if name in known or (control == "RLK_DISABLE_PLUGINS" and name in by_backend):
                    continue
                plugin, what = by_distribution.get(_normal(name)), "a distribution"
                if plugin is None:
                    plugin, what = by_backend.get(name), "a backend"
                hint = (f"; '{name}' is {what}: its plugin is named '{plugin}'"
                        if plugin else did_you_mean(name, known))
                found.append(f"{control} names '{name}', which is no plugin's entry point "
                             f"(plugins: {listing(known)}){hint}")
        return found

    def _load_all(self) -> None:
        loaded_by: dict[int, str] = {}  # id(plugin object) -> the entry point that loaded it
        for name in BUILTIN_PLUGINS:
            record = PluginRecord(name, "rlk-core", __version__, LOADED, target=name)
            self._register(record, import_module(name), loaded_by, ())
        only, disabled = env_names("RLK_PLUGINS"), env_names("RLK_DISABLE_PLUGINS")
        for entry_point in _entry_points():
            record = _record(entry_point)
            if entry_point.name in disabled:
                self.records.append(replace(record, status=BLOCKED,
                                            error="disabled by RLK_DISABLE_PLUGINS"))
            elif only and entry_point.name not in only:
                self.records.append(replace(record, status=BLOCKED,
                                            error="not listed in RLK_PLUGINS"))
            elif not _VALID_TARGET.match(entry_point.value):
                self._fail(record, f"malformed entry point value {entry_point.value!r}: "
                                   "expected 'package.module' or 'package.module:object'")
            else:
                plugin = self._attempt(record, "import", entry_point.load)
                if plugin is not _FAILED:
                    self._register(record, plugin, loaded_by, disabled)

    def _register(self, record: PluginRecord, plugin: Any, loaded_by: dict[int, str],
                  disabled: tuple[str, ...]) -> None:
        first = loaded_by.get(id(plugin))
        if first is not None:
            self.records.append(replace(record, status=DUPLICATE, error="names the plugin that "
                                        f"entry point '{first}' already loaded"))
            return
        loaded_by[id(plugin)] = record.name
        declared = getattr(plugin, "RLK_PLUGIN_API", None)
        record = replace(record, api=declared if isinstance(declared, str) else "")
        mismatch = api_versions.mismatch(declared)
        if mismatch is not None:
            self._fail(record, mismatch)
            return
        stage = self.registry.stage(record.name, record.distribution)

        def run_hook() -> None:
            manager = pluggy.PluginManager(PROJECT)
            manager.add_hookspecs(HookSpecs)
            manager.register(plugin, name=record.name)
            if not manager.hook.rlk_register.get_hookimpls():
                raise LookupError("implements no rlk_register hook (a function marked "
                                  "@rlk.backend.hookimpl)")
            manager.hook.rlk_register(registry=stage)

        if self._attempt(record, "rlk_register", run_hook) is _FAILED:
            return
        record = replace(record, backends=tuple(stage.backends))
        named = [name for name in record.backends if name in disabled]
        if named:  # blocked by its backend's name: known only once the hook has run
            self.records.append(replace(record, status=BLOCKED, error="disabled by "
                                        f"RLK_DISABLE_PLUGINS (its backend '{named[0]}')"))
            return
        self.registry.merge(stage)
        self.records.append(replace(record, status=LOADED))

    def _attempt(self, record: PluginRecord, action: str, call: Callable[[], Any]) -> Any:
        """`call()`'s result, or _FAILED after recording why: any exception but Ctrl-C
        (SystemExit from a plugin too) fails this plugin only. Slow calls are named."""
        try:
            with warn_if_slow(f"the {action} of plugin '{record.name}'",
                              _block_hint(record.name)):
                return call()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            self._fail(record, f"{action} failed: {describe(exc)}")
            return _FAILED

    def _fail(self, record: PluginRecord, error: str) -> None:
        self.records.append(replace(record, status=FAILED, error=error))
        log.warning("rlk: plugin '%s' (%s %s) is unusable: %s. %s", record.name,
                    record.distribution, record.version, error, _block_hint(record.name))


def _entry_points() -> list[metadata.EntryPoint]:
    return sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


def misplaced_entry_points() -> list[tuple[str, str]]:
    """Entry points in a group named almost like ENTRY_POINT_GROUP ("rlk.backend",
    "rlk_backends"): plugins rlk never sees, as (entry point name, a line naming the fix)."""
    found = []
    for group in sorted(metadata.entry_points().groups):
        if group == ENTRY_POINT_GROUP or not _near_miss(group):
            continue
        for point in metadata.entry_points(group=group):
            owner = point.dist.metadata["Name"] if point.dist is not None else "?"
            found.append((point.name, f"distribution {owner} declares entry point '{point.name}' "
                                      f"in group '{group}', which rlk does not read: the group "
                                      f"is '{ENTRY_POINT_GROUP}'"))
    return found


def _near_miss(group: str) -> bool:
    normal = re.sub(r"[-_\s]+", ".", group.strip().lower())
    return difflib.SequenceMatcher(None, normal, ENTRY_POINT_GROUP).ratio() >= 0.8


def _record(entry_point: metadata.EntryPoint) -> PluginRecord:
    dist = entry_point.dist
    name = dist.metadata["Name"] if dist is not None else ""
    return PluginRecord(entry_point.name, name or "", dist.version if dist is not None else "",
                        LOADED, target=entry_point.value)


def _normal(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def _block_hint(plugin: str) -> str:
    return f"Block it with RLK_DISABLE_PLUGINS={plugin}."


def failed_plugins(records: Iterable[PluginRecord]) -> list[str]:
    """Names of the plugins that failed to load."""
    return [r.name for r in records if r.status == FAILED]


def _at_fork(step: str) -> Callable[[], None]:
    def run() -> None:
        for loader in list(_LOADERS):
            getattr(loader, step)()

    return run


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(before=_at_fork("before_fork"),
                        after_in_parent=_at_fork("after_fork_in_parent"),
                        after_in_child=_at_fork("after_fork_in_child"))
