"""Entry point `flashinfer` (group `rlk.backends`): the backend and its `sample` kernel."""

from __future__ import annotations

import torch

from rlk.backend import Registry, hookimpl
from rlk_flashinfer import __version__
from rlk_flashinfer.probe import probe

RLK_PLUGIN_API = "2.1"
PRIORITY = 150


@hookimpl
def rlk_register(registry: Registry) -> None:
    registry.add_backend("flashinfer", priority=PRIORITY, probe=probe, version=__version__)
    # No batch_invariant claim (yet): tokens and processed_logp come from one program per
    # row, but logp is whatever the selected logp backend returns, and that was not audited.
    registry.add_kernel("sample", "flashinfer", "rlk_flashinfer.sampler:sample",
                        devices=("cuda",),
                        dtypes=(torch.float32, torch.bfloat16, torch.float16))
