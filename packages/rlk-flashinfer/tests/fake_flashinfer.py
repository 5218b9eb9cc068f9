"""A CPU stand-in for `flashinfer` 0.6.x: the calls the backend makes (softmax, the two
renormalisations, the radix top-k), same signatures, reference math, a call log.
FlashInfer's samplers are absent on purpose: the backend draws with its own per-row
uniforms (rlk_flashinfer.seeds), and a test fails if it reaches for one. The top-k returns
tied values in an order that changes with the batch size, as a kernel that splits rows
across blocks may: the backend must not let that order reach a row's token.
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
        sampling = types.ModuleType("flashinfer.sampling")
        for name in ("softmax", "top_k_renorm_probs", "top_p_renorm_probs"):
            setattr(sampling, name, getattr(self, name))
        topk = types.ModuleType("flashinfer.topk")
        topk.top_k = self.top_k  # type: ignore[attr-defined]
        package.sampling, package.topk = sampling, topk  # type: ignore[attr-defined]
        return {"flashinfer": package, "flashinfer.sampling": sampling, "flashinfer.topk": topk}

    def _log(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append(Call(name, args, kwargs))

    # --- the API surface the backend uses -------------------------------------------------

    def softmax(self, logits: torch.Tensor, temperature: float | None = None,
                enable_pdl: bool | None = None) -> torch.Tensor:
        self._log("softmax", logits.clone(), temperature=temperature)
        _require_contiguous(logits)
        scaled = logits.double() / (1.0 if temperature is None else temperature)
        return torch.softmax(scaled, dim=-1).float()

    def top_k_renorm_probs(self, probs: torch.Tensor, top_k: int) -> torch.Tensor:
        self._log("top_k_renorm_probs", top_k=top_k)
        _require_contiguous(probs)
        assert 0 < top_k < probs.shape[1], top_k
        kth = probs.topk(top_k, dim=-1).values[:, -1:]
        return _renorm(probs * (probs >= kth))

    def top_p_renorm_probs(self, probs: torch.Tensor, top_p: float,
                           is_deterministic: bool = False) -> torch.Tensor:
        self._log("top_p_renorm_probs", top_p=top_p, is_deterministic=is_deterministic)
        _require_contiguous(probs)
        # Like FlashInfer's radix top-p: find the value at which the descending cumulative
        # mass reaches top_p and keep every entry >= it, so ties at the boundary stay together.
        ordered = probs.double().sort(dim=-1, descending=True).values
        before = ordered.cumsum(dim=-1) - ordered
        last = (before < top_p).sum(dim=-1, keepdim=True) - 1
        threshold = ordered.gather(1, last.clamp(min=0)).to(probs.dtype)
        return _renorm(probs * (probs >= threshold))


    def top_k(self, input: torch.Tensor, k: int, sorted: bool = False,
              deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        self._log("top_k", k=k, sorted=sorted, deterministic=deterministic)
        _require_contiguous(input)
        assert 0 < k <= input.shape[1], k
        # columns rotated by the batch size before a stable sort: ties come out in an order
        # that depends on the batch
        rotation = torch.roll(torch.arange(input.shape[1]), input.shape[0])
        order = input[:, rotation].float().argsort(dim=-1, descending=True, stable=True)[:, :k]
        indices = rotation[order]
        return input.gather(1, indices), indices


def _require_contiguous(tensor: torch.Tensor) -> None:
    if not tensor.is_contiguous():
        raise ValueError("fake flashinfer: input must be contiguous (as CHECK_INPUT demands)")


def _renorm(probs: torch.Tensor) -> torch.Tensor:
    return (probs / probs.sum(dim=-1, keepdim=True)).float()
