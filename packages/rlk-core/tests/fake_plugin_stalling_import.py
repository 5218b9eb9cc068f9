"""A plugin whose module import stalls in the parent process until the loader test releases
it: a fork arriving meanwhile must not leave the child this module's import lock."""

import os

from fake_plugins import RLK_PLUGIN_API, Stalling

import rlk

if os.getpid() == Stalling.parent:
    Stalling.started.set()
    Stalling.release.wait(60)


class _Plugin:
    @rlk.hookimpl
    def rlk_register(self, registry):
        registry.add_backend("stalling_import", priority=3)


plugin = _Plugin()
plugin.RLK_PLUGIN_API = RLK_PLUGIN_API  # type: ignore[attr-defined]
