"""Registers the native backend through the same hook every plugin uses."""

from __future__ import annotations

import torch

from rlk.ops.validate import FLOATS
from rlk.plugins import PLUGIN_API_VERSION, hookimpl
from rlk.registry import Registry

RLK_PLUGIN_API = PLUGIN_API_VERSION
_EVERY_DEVICE = ("cpu", "cuda", "xpu", "mps", "meta")


# Not batch invariant: torch's CPU reductions split a row across threads when the
# batch is small, so a row's float32 sum can change with the batch size.


def probe(device: torch.device) -> str | None:
    """Native runs wherever torch does."""
    return None


@hookimpl
def rlk_register(registry: Registry) -> None:
    from rlk import __version__

    registry.add_backend("native", priority=0, probe=probe, version=__version__)
    for op in ("logp", "logp_entropy"):
        registry.add_kernel(op, "native", "rlk.native.logp:forward",
                            backward="rlk.native.logp:backward",
                            devices=_EVERY_DEVICE, dtypes=FLOATS)
    for op in ("linear_logp", "linear_logp_entropy"):
        registry.add_kernel(op, "native", "rlk.native.linear_logp:forward",
                            backward="rlk.native.linear_logp:backward",
                            devices=_EVERY_DEVICE, dtypes=FLOATS)
    registry.add_kernel("group_advantages", "native", "rlk.native.advantages:forward",
                        devices=_EVERY_DEVICE, dtypes=(torch.float32,))
    registry.add_kernel("policy_loss", "native", "rlk.native.policy_loss:forward",
                        backward="rlk.native.policy_loss:backward",
                        devices=_EVERY_DEVICE, dtypes=(*FLOATS, torch.float64))
    registry.add_kernel("sample", "native", "rlk.native.sample:sample",
                        devices=_EVERY_DEVICE, dtypes=FLOATS)
