"""In-test backends, exposed through fake entry points by test_dispatch.py."""

from __future__ import annotations

import torch

import rlk
from rlk.native import logp as native_logp

RLK_PLUGIN_API = "1.0"
calls: dict[str, int] = {"fast": 0, "check": 0}


def fast_forward(**kwargs):
    calls["fast"] += 1
    return native_logp.forward(**kwargs)


def exploding_forward(**kwargs):
    raise RuntimeError("kernel launch failed: illegal memory access")


def count_check(*, temperature, **_):
    calls["check"] += 1
    return "per-row temperature is not supported" if isinstance(temperature, torch.Tensor) else None


class Fast:
    @rlk.hookimpl
    def rlk_register(self, registry):
        registry.add_backend("fast", priority=50, version="1")
        registry.add_kernel("logp", "fast", "fake_plugins:fast_forward",
                            backward="rlk.native.logp:backward", devices=("cpu",),
                            dtypes=(torch.float32,), check=count_check,
                            properties=("batch_invariant",))


class Picky:
    @rlk.hookimpl
    def rlk_register(self, registry):
        registry.add_backend("picky", priority=60, probe=lambda d: "needs a picky device")
        registry.add_kernel("logp", "picky", "fake_plugins:fast_forward", devices=("cpu",))


class Exploding:
    @rlk.hookimpl
    def rlk_register(self, registry):
        registry.add_backend("exploding", priority=70)
        registry.add_kernel("logp", "exploding", "fake_plugins:exploding_forward",
                            devices=("cpu",))


class Duplicate:
    @rlk.hookimpl
    def rlk_register(self, registry):
        registry.add_backend("native", priority=1000)


fast, picky, exploding, duplicate = Fast(), Picky(), Exploding(), Duplicate()
for plugin in (fast, picky, exploding, duplicate):
    plugin.RLK_PLUGIN_API = RLK_PLUGIN_API  # type: ignore[attr-defined]
