"""The `cublas` floor row: the GEMMs an LM-head op cannot avoid, alone, in the same run.

A fused op's target is a multiple of its GEMMs' time ("<= 1.08x three GEMMs"). A square GEMM's
rate (the run's ceiling) overstates what cuBLAS reaches at the op's own shapes and under the
power limit of a long loop, so the floor runs those GEMMs through torch.mm at full size,
outputs in the input dtype (the strictest choice: the op itself writes float32 logits), and
its row carries no check and no finding: it is the bound, not a competitor.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from rlk.bench.workload import Call, Case, Inputs, Outputs, Peer

NOTE = ("floor, not a peer: the op's GEMMs alone through torch.mm at full size (logits, then "
        "grad_hidden and grad_weight from a logits-sized gradient), outputs unchecked")


def gemm_floor(logits_gemms: Callable[[Case], int]) -> Peer:
    """The floor of an op that computes a case's logits `logits_gemms(case)` times with its
    backward (1 for a loss that knows its gradient in the forward, 2 when the backward
    recomputes them) and once without."""

    def build(case: Case, backward: bool, device: torch.device) -> Call:
        buffers: dict[str, Tensor] = {}
        repeats = logits_gemms(case) if backward else 1

        def call(x: Inputs) -> Outputs:
            hidden = x["hidden"].detach().flatten(0, -2)
            weight = x["weight"].detach()
            if not buffers:
                shape = (hidden.shape[0], weight.shape[0])
                buffers["logits"] = hidden.new_empty(shape)
                if backward:  # values of a logits gradient's size (they do not change the time)
                    buffers["grad"] = torch.randn(shape, device=hidden.device,
                                                  dtype=hidden.dtype).mul_(1e-4)
            for _ in range(repeats):
                torch.mm(hidden, weight.t(), out=buffers["logits"])
            if not backward:
                return {}
            grad = buffers["grad"]
            torch.mm(grad, weight)
            torch.mm(grad.t(), hidden)
            return {}

        return call

    return Peer("cublas", build, note=NOTE, floor=True)
