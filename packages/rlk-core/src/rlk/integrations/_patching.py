"""Swapping a framework's functions for rlk's, and putting them back.

A framework module often imports a helper by name (`from .utils import f`), so a
helper lives in several module namespaces: `Patches.swap_everywhere` replaces every
binding of the original object under the framework's package, and `restore` undoes
each swap, including bindings made while the patch was active.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from rlk._runtime.probing import installed_version, release, version_range


class UnsupportedOptionError(ValueError):
    """A framework option (or value) that rlk cannot express exactly."""


class UnsupportedVersionError(RuntimeError):
    """The installed framework is outside the version range the adapter was tested with."""


Version = tuple[int, ...]


def check_version(distribution: str, low: Version, high: Version, tested: str) -> str:
    """The installed version of `distribution`, which must satisfy low <= version < high."""
    installed = installed_version(distribution)
    if installed is None:
        raise ImportError(f"{distribution} is not installed")
    found = release(installed)
    if found is None:
        raise UnsupportedVersionError(f"cannot read {distribution}'s version {installed!r}")
    if not low <= found < high:
        supported = f"{distribution}{version_range(low, high)}"
        raise UnsupportedVersionError(
            f"rlk's {distribution} adapter supports {supported} (tested with "
            f"{tested}); found {distribution} {installed}. Install a version in that range "
            f"or leave the framework unpatched.")
    return installed


@dataclass
class _Swap:
    owner: Any  # a module or class (attribute `name`) or a registry dict (key `name`)
    name: str
    original: Any
    replacement: Any

    def put(self, value: Any) -> None:
        if isinstance(self.owner, dict):
            self.owner[self.name] = value
        else:
            setattr(self.owner, self.name, value)


class Patches:
    """The attribute swaps one `patch()` made, undone by `restore()` in reverse order."""

    def __init__(self, package: str):
        self.package = package
        self._swaps: list[_Swap] = []
        self._scanned: tuple[int, str | None] | None = None
        self._package_modules: list[Any] = []

    def swap(self, owner: Any, name: str, replacement: Any) -> None:
        """Replace `owner.name`, keeping the raw attribute (a staticmethod stays one)."""
        self._record(_Swap(owner, name, vars(owner)[name], replacement))

    def swap_entry(self, registry: dict[str, Any], key: str, replacement: Any) -> None:
        """Replace one entry of a framework's name -> function registry."""
        self._record(_Swap(registry, key, registry[key], replacement))

    def _record(self, swap: _Swap) -> None:
        self._swaps.append(swap)
        swap.put(swap.replacement)

    def swap_everywhere(self, home: Any, name: str, replacement: Any) -> None:
        """Replace `home.name` and every binding of the same object in the package's modules."""
        original = getattr(home, name)
        for module in self._modules():
            if vars(module).get(name) is original:
                self.swap(module, name, replacement)

    def restore(self) -> None:
        for swap in reversed(self._swaps):
            swap.put(swap.original)
            if swap.owner is sys.modules.get(getattr(swap.owner, "__name__", "")):
                self._rebind_late_imports(swap)
        self._swaps.clear()

    def _rebind_late_imports(self, swap: _Swap) -> None:
        # a module imported while the patch was active bound the replacement by name
        for module in self._modules():
            if vars(module).get(swap.name) is swap.replacement:
                setattr(module, swap.name, swap.original)

    def _modules(self) -> list[Any]:
        """The package's loaded modules. Scanning sys.modules takes milliseconds once
        transformers is loaded, and a patch and its restore ask for them once per swap: the
        list is kept until a module is imported or removed (sys.modules' size or its newest
        entry changes)."""
        state = (len(sys.modules), next(reversed(sys.modules), None))
        if state != self._scanned:
            prefix = self.package + "."
            self._package_modules = [
                module for name, module in list(sys.modules.items())
                if module is not None and (name == self.package or name.startswith(prefix))]
            self._scanned = state
        return self._package_modules


class Adapter:
    """`patch()`, `unpatch()`, `is_patched()` and `patched()` for one framework.

    `install` makes the swaps on a fresh `Patches`; it runs after the version check,
    and a failure part-way undoes the swaps already made. The framework's functions are
    process-wide, so one lock orders every patch and unpatch (two threads patching at
    once install the swaps once), and `patched()` blocks share a patch one of them made:
    it stays until the last of them exits.
    """

    def __init__(self, distribution: str, supported: tuple[Version, Version], tested: str,
                 install: Callable[[Patches], None]):
        self.distribution = distribution
        self.supported = supported
        self.tested = tested
        self._install = install
        self._active: Patches | None = None
        self._lock = threading.RLock()
        self._blocks = 0  # patched() blocks open on the patch a block made
        self._pinned = False  # patch() was called: no block unpatches

    def patch(self) -> None:
        """Route the framework's functions to rlk (idempotent).

        Raises UnsupportedVersionError when the installed version is outside the tested
        range, ImportError when the framework is not installed.
        """
        with self._lock:
            self._install_once()
            self._pinned = True

    def _install_once(self) -> None:
        if self._active is not None:
            return
        check_version(self.distribution, *self.supported, self.tested)
        patches = Patches(self.distribution)
        try:
            self._install(patches)
        except BaseException:
            patches.restore()
            raise
        self._active = patches

    def unpatch(self) -> None:
        """Put the framework's own functions back (a no-op when not patched)."""
        with self._lock:
            if self._active is not None:
                self._active.restore()
                self._active = None
            self._pinned = False

    def is_patched(self) -> bool:
        return self._active is not None

    @contextlib.contextmanager
    def patched(self) -> Iterator[None]:
        """`patch()` for the block; on exit, unpatches if a block patched and no other
        block (in any thread) is still open on that patch."""
        with self._lock:
            if self._active is None:
                self._install_once()
                self._pinned = False
                self._blocks = 0
            shared = None if self._pinned else self._active
            self._blocks += shared is not None
        try:
            yield
        finally:
            with self._lock:
                if shared is not None and shared is self._active:
                    self._blocks -= 1
                    if self._blocks == 0 and not self._pinned:
                        self.unpatch()
