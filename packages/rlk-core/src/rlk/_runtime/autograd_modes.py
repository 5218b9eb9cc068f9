"""Autograd beyond first-order reverse mode: what rlk's ops refuse, and the words they use.

Kernels have a backward only. A second differentiation raises naming the op (the operator
module ties the refusal into the graph); forward mode (dual tensors, torch.func.jvp and
jacfwd) and functorch's grad transforms are refused before any kernel runs, since a jvp
through the torch operator gave zero tangents. torch.func.vmap is no derivative and runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch.autograd.forward_ad as forward_ad
from torch import Tensor
from torch._C._functorch import TransformType
from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters


def no_double_backward(name: str) -> str:
    return (f"rlk.{name} has no double backward: its kernels' gradient is not differentiable "
            "(differentiate a gradient of it again, as create_graph=True is for, and this "
            "raises)")


_NO_FORWARD_MODE = ("has no forward-mode derivative (torch.func.jvp/jacfwd/hessian, "
                    "torch.autograd.forward_ad) and no functorch grad transform "
                    "(torch.func.grad/jacrev/vjp): its kernels have a backward only. "
                    "Differentiate with torch.autograd (loss.backward(), torch.autograd.grad); "
                    "torch.func.vmap works")


def refuse_transforms(name: str) -> None:
    """Refuse functorch's grad and jvp transforms by name (torch.library's autograd for
    the operator has no functorch rule, and a jvp through it returned zero tangents)."""
    for interpreter in retrieve_all_functorch_interpreters():
        if interpreter.key() in (TransformType.Grad, TransformType.Jvp):
            raise NotImplementedError(f"rlk.{name} {_NO_FORWARD_MODE}")


def refuse_dual(name: str, args: Mapping[str, Any]) -> None:
    """Refuse dual tensors (forward-mode AD): the eager kernels would drop or fail on their
    tangents."""
    for value in args.values():
        if isinstance(value, Tensor) and forward_ad.unpack_dual(value).tangent is not None:
            raise NotImplementedError(f"rlk.{name} {_NO_FORWARD_MODE}")
