"""The hook a backend plugin implements, its markers and the plugin API version.

Public through `rlk.backend` (the module backend authors read); it sits below the plugin
loader so that the loader and the public module share this one definition.
"""

from __future__ import annotations

import pluggy

from rlk.registry import Registry

PROJECT = "rlk"
API_VERSION = "2.1"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class HookSpecs:
    """Every hook a plugin may implement (one, so far)."""

    @hookspec
    def rlk_register(self, registry: Registry) -> None:
        """Declare this plugin's backends and their kernels.

        Called once per process, lazily (at the first op or introspection call), with a
        registry of the plugin's own: call `registry.add_backend(name, ...)` for each
        backend, then `registry.add_kernel(op, name, "module:function", ...)` for each op it
        serves. Declarations land only if the whole hook returns; if it raises, none do and
        the plugin is recorded as failed. The hook may not touch other plugins' backends.
        """
