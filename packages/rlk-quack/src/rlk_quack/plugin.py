"""Entry point `quack` (group `rlk.backends`): the backend and its `linear_logp` forward."""

from __future__ import annotations

import torch

from rlk.backend import Registry, hookimpl
from rlk_quack import __version__
from rlk_quack.kernel import check
from rlk_quack.probe import probe

RLK_PLUGIN_API = "2.0"
# Below rlk-cuda (200) until this backend's GPU test has passed on a GPU (it has not yet run on
# one): opt in with RLK_BACKENDS=quack or rlk.use_backends("quack"). The calls `check` takes
# measured 0.94-0.99x one GEMM through QuACK, 1.17-1.26x through rlk-cuda; the others fall
# through to it.
PRIORITY = 150


@hookimpl
def rlk_register(registry: Registry) -> None:
    registry.add_backend("quack", priority=PRIORITY, probe=probe, version=__version__)
    if "linear_logp" in registry.known_ops:
        # no backward: the dispatcher passes over this kernel when an input requires grad
        registry.add_kernel("linear_logp", "quack", "rlk_quack.kernel:forward",
                            devices=("cuda",), dtypes=(torch.bfloat16, torch.float16),
                            check=check)
