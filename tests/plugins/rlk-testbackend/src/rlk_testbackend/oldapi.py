"""A plugin written for an incompatible plugin API major version."""

from __future__ import annotations

from rlk.backend import hookimpl

RLK_PLUGIN_API = "0.9"


@hookimpl
def rlk_register(registry) -> None:
    registry.add_backend("oldapi", priority=500)
