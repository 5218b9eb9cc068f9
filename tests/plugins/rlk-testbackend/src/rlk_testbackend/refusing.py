"""A backend whose probe always refuses, with a reason: it must list, never serve."""

from __future__ import annotations

from rlk.backend import hookimpl

RLK_PLUGIN_API = "2.0"


def probe(device) -> str:
    return "needs a Faraway accelerator (none found)"


@hookimpl
def rlk_register(registry) -> None:
    registry.add_backend("faraway", priority=300, probe=probe, version="9.9")
    registry.add_kernel("logp", "faraway", "rlk_testbackend.good:forward",
                        devices=("cpu", "cuda"))
