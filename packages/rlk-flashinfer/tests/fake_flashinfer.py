"""A CPU stand-in for `flashinfer` 0.6.x: same call signatures, reference math, a call log.

Its random numbers follow the real library's structure: one draw per output position,
keyed by (seed, position in the launch, offset). A wrapper that put rows at positions
that depend on the batch would therefore see its draws change with the batch, as it
would on the GPU.
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

    def module(self) -> tuple[types.ModuleType, types.ModuleType]:
        package = types.ModuleType("flashinfer")
        package.__version__ = self.version  # type: ignore[attr-defined]
        sampling = types.ModuleType("flashinfer.sampling")
        for name in ("softmax", "top_k_renorm_probs", "top_p_renorm_probs",
                     "sampling_from_probs", "min_p_sampling_from_probs"):
            setattr(sampling, name, getattr(self, name))
        package.sampling = sampling  # type: ignore[attr-defined]
        return package, sampling

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

    def sampling_from_probs(self, probs: torch.Tensor, indices: torch.Tensor | None = None,
                            deterministic: bool = True, generator: Any = None,
                            check_nan: bool = False, seed: int | None = None,
                            offset: int | None = None, return_valid: bool = False) -> torch.Tensor:
        self._log("sampling_from_probs", indices=indices, deterministic=deterministic,
                  seed=seed, offset=offset)
        return _draw(probs, indices, seed, offset, torch.zeros(()))

    def min_p_sampling_from_probs(self, probs: torch.Tensor, min_p: float,
                                  indices: torch.Tensor | None = None, deterministic: bool = True,
                                  generator: Any = None, check_nan: bool = False,
                                  seed: int | None = None, offset: int | None = None,
                                  return_valid: bool = False) -> torch.Tensor:
        self._log("min_p_sampling_from_probs", min_p=min_p, indices=indices,
                  deterministic=deterministic, seed=seed, offset=offset)
        pivot = probs.amax(dim=-1, keepdim=True) * min_p
        return _draw(probs, indices, seed, offset, pivot)


def _require_contiguous(tensor: torch.Tensor) -> None:
    if not tensor.is_contiguous():
        raise ValueError("fake flashinfer: input must be contiguous (as CHECK_INPUT demands)")


def _renorm(probs: torch.Tensor) -> torch.Tensor:
    return (probs / probs.sum(dim=-1, keepdim=True)).float()


def _draw(probs: torch.Tensor, indices: torch.Tensor | None, seed: int | None,
          offset: int | None, pivot: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw per output position over entries >= pivot, like FlashInfer's kernels."""
    if seed is None or offset is None or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"fake flashinfer: expected a non-negative int seed, got {seed!r}")
    _require_contiguous(probs)
    if indices is None:
        indices = torch.arange(probs.shape[0])
    assert indices.dtype == torch.int64 and indices.device == probs.device
    out = torch.empty(indices.numel(), dtype=torch.int64)
    for position, row in enumerate(indices.tolist()):
        row_pivot = pivot.reshape(-1)[row] if pivot.dim() else pivot
        weights = probs[row].double() * (probs[row] >= row_pivot)
        cdf = weights.cumsum(0)
        u = _uniform(seed, position, offset) * float(cdf[-1])
        out[position] = min(int(torch.searchsorted(cdf, u, right=True)), probs.shape[1] - 1)
    return out


def _uniform(seed: int, position: int, offset: int) -> float:
    """A uniform in [0, 1) that depends on (seed, position, offset) only."""
    mixed = (seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9 + offset) % (1 << 63)
    generator = torch.Generator().manual_seed(mixed)
    return float(torch.rand((), generator=generator, dtype=torch.float64))
