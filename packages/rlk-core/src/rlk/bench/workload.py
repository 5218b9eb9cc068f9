"""What one workload declares: its shapes, inputs, the rlk call, its peers, its check and cost.

The runner knows nothing op-specific: everything it needs to time, check and place a
row on the roofline comes from a `Workload`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

Inputs = dict[str, Any]
Outputs = dict[str, Tensor]
Call = Callable[[Inputs], Outputs]

FORWARD = "fwd"
FORWARD_BACKWARD = "fwd+bwd"


class Blocked(Exception):
    """An implementation cannot run in this environment; the message says why."""


@dataclass(frozen=True)
class Case:
    """One shape of a workload; `dtype` pins the input dtype (else the run's --dtype)."""

    label: str
    dims: Mapping[str, int | float]
    dtype: torch.dtype | None = None


@dataclass(frozen=True)
class Cost:
    """The least work any implementation must do: bytes through memory and matrix FLOPs."""

    bytes: float
    flops: float = 0.0


@dataclass(frozen=True)
class Error:
    """Distance of one output from the float64 reference (NaN on one side only is inf)."""

    name: str
    max_abs: float
    max_ref: float
    invalid: int = 0  # for outputs checked by membership (sampled tokens): how many are wrong


@dataclass(frozen=True)
class Peer:
    """A named implementation outside rlk, measured in the same process.

    `build(case, backward, device)` returns the call or raises `Blocked`; `mutates` names the
    inputs the call overwrites in forward+backward mode (they are restored before
    every call, outside the timed region). A `floor` is a bound rather than a competitor
    (rlk.bench.floors): its row is timed beside the others, never checked against rlk's
    and never makes a finding.
    """

    name: str
    build: Callable[[Case, bool, torch.device], Call]
    mutates: tuple[str, ...] = ()
    note: str = ""
    floor: bool = False


@dataclass(frozen=True)
class Variant:
    """An rlk backend measured again under environment settings that pick one of its own
    paths (e.g. RLK_CUDA_LOGP_FORWARD=tma), as the row `rlk:<backend>-<name>`.

    `unavailable(device)` gives the reason the row is blocked on `device`, or None.
    """

    backend: str
    name: str
    env: Mapping[str, str]
    unavailable: Callable[[torch.device], str | None] = lambda device: None


@dataclass(frozen=True)
class Workload:
    """One benchmark workload.

    - `inputs(case, dtype, device, seed, backward)`: fresh random inputs; leaves that
      need gradients have requires_grad set when `backward`; `check_rows` (if any)
      names the rows the float64 check covers.
    - `rlk_call(backward)`: the call through the public rlk function; raises `Blocked`
      when this rlk-core lacks the op.
    - `reference(inputs, backward)`: what `compare` needs from the float64 truth,
      computed once from pristine inputs.
    - `compare(reference, outputs, inputs)`: errors per output.
    - `cost(case, dtype, backward)`: bytes and FLOPs for the roofline.
    - `variants`: extra rows of measured backends, each under its own environment settings.
    """

    name: str
    op: str
    modes: tuple[str, ...]
    cases: tuple[Case, ...]
    smoke_cases: tuple[Case, ...]
    inputs: Callable[[Case, torch.dtype, torch.device, int, bool], Inputs]
    rlk_call: Callable[[bool], Call]
    reference: Callable[[Inputs, bool], Any]
    compare: Callable[[Any, Outputs, Inputs], list[Error]]
    cost: Callable[[Case, torch.dtype, bool], Cost]
    peers: Mapping[str, Peer] = field(default_factory=dict)
    backends: tuple[str, ...] | None = None
    variants: tuple[Variant, ...] = ()
    doc: str = ""


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def rlk_function(name: str) -> Callable[..., Any]:
    """The public rlk function `name`, or Blocked when this rlk-core does not define it yet."""
    import rlk

    function = getattr(rlk, name, None)
    if function is None:
        raise Blocked(f"this rlk-core ({rlk.__version__}) has no rlk.{name}")
    return function


def grads(outputs: Tensor | tuple[Tensor, ...], upstream: tuple[Tensor, ...],
          leaves: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """Gradients of sum(output * upstream) w.r.t. leaves, without touching `.grad`."""
    outs = outputs if isinstance(outputs, tuple) else (outputs,)
    cast = tuple(g.to(o.dtype) for g, o in zip(upstream, outs, strict=True))
    found = torch.autograd.grad(outs, leaves, cast)
    return tuple(found)
