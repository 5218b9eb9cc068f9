"""A backend that registers fine but whose kernel module cannot load (a missing extension).

Kernels are imported on first use, so the backend still lists, with the reason.
"""

from __future__ import annotations

from rlk.backend import hookimpl

RLK_PLUGIN_API = "2.0"


@hookimpl
def rlk_register(registry) -> None:
    registry.add_backend("lazyfail", priority=250, version="0.0.1")
    registry.add_kernel("logp", "lazyfail", "rlk_testbackend._missing_extension:forward",
                        devices=("cpu",))
