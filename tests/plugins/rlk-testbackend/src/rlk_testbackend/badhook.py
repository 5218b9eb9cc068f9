"""A plugin whose registration hook raises halfway: nothing it added may survive."""

from __future__ import annotations

from rlk.backend import hookimpl

RLK_PLUGIN_API = "2.0"


@hookimpl
def rlk_register(registry) -> None:
    registry.add_backend("halfway", priority=400)
    raise RuntimeError("could not read the device table")
