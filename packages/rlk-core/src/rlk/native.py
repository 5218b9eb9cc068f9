"""Registers the native backend through the same hook every plugin uses.

Each op's spec names its native kernel (`OpSpec.native`), so a new op registers here
without an edit to this file.
"""

from __future__ import annotations

import torch

from rlk._runtime.spec import specs
from rlk.backend import API_VERSION, Registry, hookimpl
from rlk.version import __version__

RLK_PLUGIN_API = API_VERSION
_EVERY_DEVICE = ("cpu", "cuda", "xpu", "mps", "meta")


# Not batch invariant: torch's CPU reductions split a row across threads when the
# batch is small, so a row's float32 sum can change with the batch size.


def probe(device: torch.device) -> str | None:
    """Native runs wherever torch does."""
    return None


@hookimpl
def rlk_register(registry: Registry) -> None:
    registry.add_backend("native", priority=0, probe=probe, version=__version__)
    for spec in specs().values():
        if spec.native is not None and spec.name in registry.known_ops:
            registry.add_kernel(spec.name, "native", spec.native.forward,
                                backward=spec.native.backward, devices=_EVERY_DEVICE,
                                dtypes=spec.dtypes, uses=spec.native.uses)
