"""Entry point `quack` (group `rlk.backends`): the backend and its `linear_logp` forward."""

from __future__ import annotations

import torch

from rlk.backend import Registry, hookimpl
from rlk_quack import __version__
from rlk_quack.kernel import check
from rlk_quack.probe import probe

RLK_PLUGIN_API = "2.1"
# Above rlk-cuda (200): on an H100 the calls `check` takes ran 0.94-1.00x one cuBLAS GEMM
# through this backend, where rlk-cuda's forward ran 1.17-1.27x (docs/backends/quack.md); the
# others fall through to rlk-cuda.
PRIORITY = 250


@hookimpl
def rlk_register(registry: Registry) -> None:
    registry.add_backend("quack", priority=PRIORITY, probe=probe, version=__version__)
    if "linear_logp" in registry.known_ops:
        # no backward: the dispatcher passes over this kernel when an input requires grad
        registry.add_kernel("linear_logp", "quack", "rlk_quack.kernel:forward",
                            devices=("cuda",), dtypes=(torch.bfloat16, torch.float16),
                            check=check)
