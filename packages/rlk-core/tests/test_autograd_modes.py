"""What rlk's ops do under autograd modes beyond first-order reverse mode (issue #31 S4, S5).

Kernels have a backward only. A second differentiation raises, naming the op, in every form
(also when the graph holds other differentiable terms, where it was silently dropped);
forward mode and functorch's grad transforms are refused by name (a jvp gave zero
tangents). Every public differentiable op is covered, eager and through its torch operator.
"""

from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as forward_ad
from torch.utils._python_dispatch import TorchDispatchMode

import rlk

GEN = torch.Generator().manual_seed(31)


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=GEN, dtype=torch.float64).float()


TOKENS = torch.randint(0, 9, (4,), generator=GEN)
OLD, ADV, MASK = _randn(2, 3), _randn(2), torch.ones(2, 3)
WEIGHT = _randn(9, 5)
LINEAR_TOKENS = torch.randint(0, 9, (2, 3), generator=GEN)


# op name -> (the differentiable input, a function of it giving one tensor)
OPS = {
    "logp": (lambda: _randn(4, 9), lambda x: rlk.logp(x, TOKENS)),
    "logp_entropy": (lambda: _randn(4, 9), lambda x: sum(rlk.logp_entropy(x, TOKENS))),
    "entropy": (lambda: _randn(4, 9), lambda x: rlk.entropy(x)),
    "policy_loss": (lambda: OLD + 0.1 * _randn(2, 3),
                    lambda x: rlk.policy_loss(x, OLD, ADV, MASK)[0]),
    "policy_loss-sapo": (lambda: OLD + 0.1 * _randn(2, 3),
                         lambda x: rlk.policy_loss(x, OLD, ADV, MASK, objective="sapo")[0]),
    "token_kl": (lambda: _randn(2, 3), lambda x: rlk.token_kl(x, OLD, kl_estimator="k3")),
    "linear_logp": (lambda: _randn(4, 5), lambda x: rlk.linear_logp(x, WEIGHT, TOKENS)),
    "linear_logp_entropy": (lambda: _randn(4, 5),
                            lambda x: sum(rlk.linear_logp_entropy(x, WEIGHT, TOKENS))),
    "linear_policy_loss": (lambda: _randn(2, 3, 5), lambda x: rlk.linear_policy_loss(
        x, WEIGHT, LINEAR_TOKENS, OLD, ADV, MASK)[0]),
}


def _name(op: str) -> str:
    return op.split("-")[0]


class _Recording(TorchDispatchMode):
    """Any dispatch mode sends a call through the op's torch operator (the traced path)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("path", ["eager", "operator"])
@pytest.mark.parametrize("form", ["autograd.grad", "backward"])
@pytest.mark.parametrize("op", list(OPS))
def test_double_backward_raises_next_to_other_terms(op, form, path):
    """S4: with (x^3).sum() beside the op, differentiating the gradient used to skip the
    op's refusal and return the other term's second derivative alone."""
    make, function = OPS[op]
    x = make().requires_grad_(True)
    match = rf"rlk\.{_name(op)} has no double backward"
    with pytest.raises(RuntimeError, match=match):
        if path == "operator":
            with _Recording():
                loss = function(x).sum() + x.pow(3).sum()
        else:
            loss = function(x).sum() + x.pow(3).sum()
        (grad,) = torch.autograd.grad(loss, x, create_graph=True)
        if form == "backward":
            grad.pow(2).sum().backward()
        else:
            torch.autograd.grad(grad.pow(2).sum(), x)


@pytest.mark.parametrize("op", list(OPS))
def test_first_order_under_create_graph_is_the_plain_gradient(op):
    """create_graph=True alone is fine where the op can tie its refusal to its inputs: the
    gradient's value is the ordinary one."""
    make, function = OPS[op]
    x = make().requires_grad_(True)
    (want,) = torch.autograd.grad(function(x).sum(), x)
    try:
        (got,) = torch.autograd.grad(function(x).sum(), x, create_graph=True)
    except RuntimeError as error:  # ops whose kernels give their gradients in the forward
        assert f"rlk.{_name(op)} has no double backward" in str(error)
        return
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def _jvp(function, x):
    return torch.func.jvp(function, (x,), (torch.ones_like(x),))


def _dual(function, x):
    with forward_ad.dual_level():
        return function(forward_ad.make_dual(x, torch.ones_like(x)))


TRANSFORMS = {
    "func.grad": lambda f, x: torch.func.grad(lambda y: f(y).sum())(x),
    "func.vjp": lambda f, x: torch.func.vjp(f, x),
    "func.jacrev": lambda f, x: torch.func.jacrev(f)(x),
    "func.jvp": _jvp,
    "func.jacfwd": lambda f, x: torch.func.jacfwd(f)(x),
    "func.hessian": lambda f, x: torch.func.hessian(lambda y: f(y).sum())(x),
    "forward_ad": _dual,
}


@pytest.mark.parametrize("transform", list(TRANSFORMS))
@pytest.mark.parametrize("op", list(OPS))
def test_forward_mode_and_functorch_transforms_are_refused_by_name(op, transform):
    """S5: torch.func.jvp gave zero tangents; grad/jacrev raised torch's "must override
    setup_context". Never zeros: a clear refusal naming the op."""
    make, function = OPS[op]
    with pytest.raises(NotImplementedError, match=rf"rlk\.{_name(op)} has no forward-mode"):
        TRANSFORMS[transform](function, make())


def test_vmap_still_runs_the_op():
    """vmap is no derivative: it keeps working (torch's per-sample fallback)."""
    logits = _randn(3, 4, 9)
    got = torch.func.vmap(lambda x: rlk.logp(x, TOKENS))(logits)
    torch.testing.assert_close(got, torch.stack([rlk.logp(x, TOKENS) for x in logits]))
