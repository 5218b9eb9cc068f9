"""A plugin module that calls rlk at import time, before its hook runs."""

import torch

import rlk

RLK_PLUGIN_API = "2.0"
AT_IMPORT = rlk.logp(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long))


@rlk.hookimpl
def rlk_register(registry):
    registry.add_backend("calls_rlk", priority=5)
