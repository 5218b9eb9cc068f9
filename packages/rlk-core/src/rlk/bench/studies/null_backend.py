"""A `null` backend whose kernels return their outputs at once, so that a call's time is
rlk's own host cost alone: validation, dispatch, autograd.

Its sample kernel calls rlk.backend.drawn_logp, as rlk-flashinfer's does. The outputs of
policy_loss, group_advantages and sample are made once by `prepare` (kernels that compute
nothing have nothing to allocate).
"""

from __future__ import annotations

from typing import Any

import torch

from rlk.backend import drawn_logp
from rlk.dispatch import get_dispatcher
from rlk.ops.policy_loss.op import METRICS

_OUT: dict[str, torch.Tensor] = {}
_HERE = __name__


def prepare(loss_shape: tuple[int, int], rewards: int, samples: int) -> None:
    """The preallocated outputs, for a [B, T] policy loss, N rewards and B sampled rows."""
    _OUT.update(loss=torch.zeros(()), metrics=torch.zeros(len(METRICS)),
                grad=torch.zeros(loss_shape), advantages=torch.zeros(rewards),
                tokens=torch.zeros(samples, dtype=torch.int64))


def null_policy_loss(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return _OUT["loss"], _OUT["metrics"]


def null_policy_loss_backward(*args: Any, **kwargs: Any) -> torch.Tensor:
    return _OUT["grad"]


def null_group_advantages(*args: Any, **kwargs: Any) -> torch.Tensor:
    return _OUT["advantages"]


def null_logp(logits: torch.Tensor, tokens: torch.Tensor, temperature: Any, ignore_index: int,
              rows: Any, out: Any, with_entropy: bool) -> tuple[torch.Tensor | None, ...]:
    count = logits.shape[0]
    return (torch.empty(count), torch.empty(count) if with_entropy else None,
            torch.empty(count, dtype=torch.float64))


def null_logp_backward(grad_logp: torch.Tensor, grad_entropy: Any, logits: torch.Tensor,
                       *args: Any) -> torch.Tensor:
    return torch.empty_like(logits)


def null_entropy(logits: torch.Tensor, **_: Any) -> tuple[torch.Tensor, torch.Tensor]:
    count = logits.shape[0]
    return torch.empty(count), torch.empty(count, dtype=torch.float64)


def null_entropy_backward(grad_entropy: torch.Tensor, logits: torch.Tensor,
                          *args: Any) -> torch.Tensor:
    return torch.empty_like(logits)


def null_sample(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
                min_p: float, seeds: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A sampler without a logp kernel of its own (rlk-flashinfer's layout)."""
    tokens = _OUT["tokens"]
    logp = drawn_logp(logits, tokens, temperature)
    return tokens, logp, logp.clone()


def register() -> None:
    """The null backend above every other, serving these ops on the CPU."""
    registry = get_dispatcher().registry
    get_dispatcher().loader.ensure_loaded()
    registry.add_backend("null", priority=10_000)
    registry.add_kernel("policy_loss", "null", f"{_HERE}:null_policy_loss",
                        backward=f"{_HERE}:null_policy_loss_backward", devices=("cpu",))
    registry.add_kernel("group_advantages", "null", f"{_HERE}:null_group_advantages",
                        devices=("cpu",))
    for op in ("logp", "logp_entropy"):
        registry.add_kernel(op, "null", f"{_HERE}:null_logp",
                            backward=f"{_HERE}:null_logp_backward", devices=("cpu",))
    registry.add_kernel("entropy", "null", f"{_HERE}:null_entropy",
                        backward=f"{_HERE}:null_entropy_backward", devices=("cpu",))
    registry.add_kernel("sample", "null", f"{_HERE}:null_sample", devices=("cpu",))
