"""A CPU stand-in for `flashinfer` 0.6.x: the one call the backend makes (the radix top-k),
same signature, reference math, a call log. FlashInfer's samplers, softmax and
renormalisations are absent on purpose: a test fails if the backend reaches for one. The
top-k returns its K entries in an order that changes with the batch size, ties included,
as an unsorted radix select may: the backend must not let that order reach a row's token.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Call:
    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass
class FakeFlashInfer:
    version: str = "0.6.8"
    calls: list[Call] = field(default_factory=list)

    def names(self) -> list[str]:
        return [call.name for call in self.calls]

    def modules(self) -> dict[str, types.ModuleType]:
        """The package and its submodules, by the names `sys.modules` knows them."""
        package = types.ModuleType("flashinfer")
        package.__version__ = self.version  # type: ignore[attr-defined]
        topk = types.ModuleType("flashinfer.topk")
        topk.top_k = self.top_k  # type: ignore[attr-defined]
        sampling = types.ModuleType("flashinfer.sampling")  # present, and nothing in it
        package.sampling, package.topk = sampling, topk  # type: ignore[attr-defined]
        return {"flashinfer": package, "flashinfer.sampling": sampling, "flashinfer.topk": topk}

    def top_k(self, input: torch.Tensor, k: int, sorted: bool = False,
              deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls.append(Call("top_k", (), {"k": k, "sorted": sorted,
                                              "deterministic": deterministic}))
        if not input.is_contiguous():
            raise ValueError("fake flashinfer: input must be contiguous (as CHECK_INPUT demands)")
        assert 0 < k <= input.shape[1], k
        # columns rotated by the batch size before a stable sort: ties come out in an order
        # that depends on the batch; unsorted output is rotated by the batch size as well
        rotation = torch.roll(torch.arange(input.shape[1]), input.shape[0])
        order = input[:, rotation].float().argsort(dim=-1, descending=True, stable=True)[:, :k]
        indices = rotation[order]
        if not sorted:
            indices = torch.roll(indices, input.shape[0], dims=1)
        return input.gather(1, indices), indices
