"""rlk.token_kl: each estimator against its float64 definition, and against policy_loss's KL."""

from __future__ import annotations

import pytest
import torch

import rlk

F64 = torch.float64


def _inputs(seed: int = 0, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(5, 9, generator=gen, dtype=F64) * 4
    ref = logp + torch.randn(5, 9, generator=gen, dtype=F64) * 0.8
    ref[0, 0] = logp[0, 0] - 30.0  # beyond any clamp: k3's exp(30) and the clamp binding
    ref[0, 1] = logp[0, 1] + 25.0
    ref[1, 2] = logp[1, 2]  # identical: every estimator 0
    return logp.to(dtype), ref.to(dtype)


def _definition(logp: torch.Tensor, ref: torch.Tensor, estimator: str,
                clamp: float | None) -> torch.Tensor:
    """The estimators as Schulman (2020) and verl's kl_penalty define them, float64."""
    delta = logp - ref
    base = estimator.rstrip("+")
    value = {"k1": delta, "k2": 0.5 * delta.square(), "k3": torch.exp(-delta) + delta - 1,
             "abs": delta.abs()}[base]
    if clamp is not None:
        value = value.clamp(-clamp, clamp)
    if estimator.endswith("+"):  # the value, with k2's gradient
        square = 0.5 * delta.square()
        value = square - square.detach() + value.detach()
    return value


ESTIMATORS = ["k1", "k2", "k3", "abs", "k1+", "k3+", "abs+"]


@pytest.mark.parametrize("clamp", [None, 10.0, 0.3])
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_each_estimator_matches_its_float64_definition(estimator: str,
                                                       clamp: float | None) -> None:
    logp, ref = _inputs()
    exact_leaf = logp.double().requires_grad_(True)
    want = _definition(exact_leaf, ref.double(), estimator, clamp)
    upstream = torch.rand(want.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    (want_grad,) = torch.autograd.grad(want, exact_leaf, upstream)
    leaf = logp.clone().requires_grad_(True)
    got = rlk.token_kl(leaf, ref, kl_estimator=estimator, kl_clamp=clamp)
    (got_grad,) = torch.autograd.grad(got, leaf, upstream.float())
    assert got.dtype == torch.float32 and got.shape == logp.shape
    finite = want.detach().abs() < 1e6  # k3 at delta = -30 is e^30 in both
    torch.testing.assert_close(got.double()[finite], want.detach()[finite], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_grad.double(), want_grad, rtol=1e-6, atol=1e-6)
    assert float(got.detach()[1, 2]) == 0.0


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_it_is_the_kl_policy_loss_adds(estimator: str) -> None:
    """policy_loss with zero advantages, kl_coef=1 and token-sum is the masked sum of token_kl."""
    logp, ref = _inputs(seed=2)
    mask = torch.rand(logp.shape, generator=torch.Generator().manual_seed(3)) > 0.3
    options = rlk.PolicyLossOptions(kl_coef=1.0, kl_estimator=estimator, kl_clamp=10.0,
                                    agg="token-sum")
    leaf = logp.clone().requires_grad_(True)
    loss, _ = rlk.policy_loss(leaf, logp, torch.zeros(logp.shape[0]), mask, ref_logp=ref,
                              options=options)
    (want_grad,) = torch.autograd.grad(loss, leaf)
    kl = rlk.token_kl(leaf, ref, options=options)
    (got_grad,) = torch.autograd.grad(kl[mask].sum(), leaf)
    torch.testing.assert_close(kl[mask].sum(), loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-6, atol=1e-6)


def test_dtypes() -> None:
    logp, ref = _inputs(dtype=F64)
    assert rlk.token_kl(logp, ref).dtype == F64  # float64 stays float64
    half = logp.to(torch.bfloat16).requires_grad_(True)
    value = rlk.token_kl(half, ref.float(), kl_estimator="k2")
    (grad,) = torch.autograd.grad(value.sum(), half)
    assert value.dtype == torch.float32 and grad.dtype == torch.bfloat16
    torch.testing.assert_close(grad.float(), (half - ref.float()).detach().to(torch.bfloat16)
                               .float(), rtol=1e-2, atol=1e-2)


def test_the_reference_gets_no_gradient() -> None:
    logp, ref = _inputs()
    ref = ref.clone().requires_grad_(True)
    value = rlk.token_kl(logp.clone().requires_grad_(True), ref)
    assert torch.autograd.grad(value.sum(), ref, allow_unused=True) == (None,)


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda lp, ref: rlk.token_kl(lp, ref, kl_coef=0.1), TypeError, "kl_estimator, kl_clamp"),
    (lambda lp, ref: rlk.token_kl(lp, ref, kl_estimator="k4"), ValueError, "k4"),
    (lambda lp, ref: rlk.token_kl(lp, ref, kl_clamp=-1.0), ValueError, "kl_clamp"),
    (lambda lp, ref: rlk.token_kl(lp, ref, options=rlk.PolicyLossOptions(
        kl_bias_correction=True)), ValueError, "needs old_logp"),
    (lambda lp, ref: rlk.token_kl(lp, ref[:, :3]), ValueError, r"shape \(5, 9\)"),
    (lambda lp, ref: rlk.token_kl(lp, ref.long()), TypeError, "ref_logp must have dtype"),
])
def test_bad_arguments_raise(call, error: type[Exception], message: str) -> None:
    logp, ref = _inputs()
    with pytest.raises(error, match=message):
        call(logp, ref)
