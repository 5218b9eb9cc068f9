"""policy_loss kernels against the float64 reference and the native code, outputs poisoned."""

from __future__ import annotations

from typing import Any

import pytest
import rlk
import torch
from rlk import reference
from rlk.native import policy_loss as native
from rlk.ops import specs
from rlk.ops.spec import Tolerance
from rlk.testing.compare import assert_matches
from rlk.testing.poison import poisoned_allocations

from rlk_cuda import policy_loss as kernels

pytestmark = pytest.mark.gpu
TENSORS = ("logp", "old_logp", "advantages", "mask", "ref_logp", "rollout_logp")
TOL = Tolerance(atol=1e-5, rtol=1e-5)
GRAD_TOL = Tolerance(atol=1e-8, rtol=1e-4)  # gradients of the large cases are ~1 / tokens
SPEC = specs()["policy_loss"]
SAMPLE_NAMES = [sample.name for sample in SPEC.samples(torch.device("cpu"), torch.float32)]


def _split(args: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    return [args[name] for name in TENSORS], {k: v for k, v in args.items() if k not in TENSORS}


def _reference(args: dict[str, Any], grad_loss: float = 1.0) -> tuple[torch.Tensor, ...]:
    """float64 loss, metrics and d(loss * grad_loss)/d logp through autograd."""
    tensors, options = _split(args)
    leaf = tensors[0].detach().double().requires_grad_(True)
    loss, metrics = reference.policy_loss(leaf, *tensors[1:4], ref_logp=tensors[4],
                                          rollout_logp=tensors[5], **options)
    (grad,) = torch.autograd.grad(loss * grad_loss, leaf, allow_unused=True)
    return loss.detach(), metrics, torch.zeros_like(leaf) if grad is None else grad


def _check(args: dict[str, Any], grad_tol: Tolerance) -> None:
    tensors, options = _split(args)
    want_loss, want_metrics, want_grad = _reference(args, grad_loss=0.75)
    upstream = torch.tensor(0.75, device="cuda")
    with poisoned_allocations():
        loss, metrics = kernels.forward(*tensors, **options)
        grad = kernels.backward(upstream, *tensors, **options)
    assert loss.shape == () and metrics.shape == (4,) and grad.shape == tensors[0].shape
    assert_matches("loss", loss, want_loss, TOL)
    assert_matches("metrics", metrics, want_metrics, TOL)
    assert_matches("grad", grad, want_grad, grad_tol)
    native_loss, native_metrics = native.forward(*tensors, **options)
    assert_matches("loss vs native", loss, native_loss, TOL)
    assert_matches("metrics vs native", metrics, native_metrics, TOL)


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_conformance_samples(name: str) -> None:
    samples = SPEC.samples(torch.device("cuda"), torch.float32)
    (sample,) = [sample for sample in samples if sample.name == name]
    _check(dict(sample.args), Tolerance(atol=1e-6, rtol=1e-5))


def _large(seed: int, batch: int = 64, length: int = 4096, per_token: bool = False,
           **options: Any) -> dict[str, Any]:
    """Log ratios on a grid of 1/64, so no ratio sits within rounding of a clip boundary."""
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def noise(scale: float) -> torch.Tensor:
        return torch.randn(batch, length, generator=gen, device="cuda") * scale

    def shift() -> torch.Tensor:
        steps = torch.randint(-24, 25, (batch, length), generator=gen, device="cuda")
        return steps.float() / 64

    logp = -noise(1.0).abs()
    old = logp + shift()
    lengths = torch.randint(0, length + 1, (batch, 1), generator=gen, device="cuda")
    if batch > 1:
        lengths[0], lengths[1] = length, 0  # a full and an empty sequence
    mask = (torch.arange(length, device="cuda") < lengths).float()
    adv_shape = (batch, length) if per_token else (batch,)
    args: dict[str, Any] = dict(
        logp=logp, old_logp=old,
        advantages=torch.randn(adv_shape, generator=gen, device="cuda"), mask=mask,
        ref_logp=logp + noise(0.3), rollout_logp=old + shift(), clip_low=0.2, clip_high=0.28,
        dual_clip=None, kl_coef=0.001, kl_estimator="k3", ratio_level="token", agg="token-mean",
        tis_cap=None)
    args.update(options)
    return args


LARGE = {
    "dapo-k3-token-mean": {},
    "grpo-k2-seq-mean-token-mean": dict(kl_estimator="k2", kl_coef=0.04,
                                        agg="seq-mean-token-mean"),
    "gspo": dict(ratio_level="sequence", clip_low=3e-3, clip_high=4e-3, kl_coef=0.0,
                 agg="seq-mean-token-mean"),
    "tis-dual-clip-per-token": dict(per_token=True, dual_clip=1.4, tis_cap=1.1,
                                    agg="seq-mean-token-sum"),
    "dr-grpo-k1": dict(kl_estimator="k1", agg="seq-mean-token-sum-norm"),
}


@pytest.mark.parametrize("name", sorted(LARGE))
def test_large_batch(name: str) -> None:
    _check(_large(seed=len(name), **LARGE[name]), GRAD_TOL)


def test_masked_garbage_is_ignored_on_both_paths() -> None:
    for length in (4096, 4093):  # 16-byte loads, then the scalar path
        args = _large(seed=5, batch=8, length=length, per_token=True, tis_cap=1.2)
        tensors, options = _split(args)
        dirty = [t.clone() for t in tensors]
        hidden = dirty[3] == 0
        for index, value in ((0, float("nan")), (1, float("inf")), (2, float("nan")),
                             (4, float("-inf")), (5, float("nan"))):
            dirty[index][hidden] = value
        clean_out = (*kernels.forward(*tensors, **options),
                     kernels.backward(torch.tensor(1.0, device="cuda"), *tensors, **options))
        dirty_out = (*kernels.forward(*dirty, **options),
                     kernels.backward(torch.tensor(1.0, device="cuda"), *dirty, **options))
        for clean, messy in zip(clean_out, dirty_out, strict=True):
            assert torch.equal(clean, messy)
        assert bool(clean_out[2][hidden].eq(0).all())


def test_unaligned_rows_take_the_scalar_path() -> None:
    args = _large(seed=9, batch=16, length=512)
    for name in ("logp", "old_logp", "mask"):
        buffer = torch.empty(args[name].numel() + 1, device="cuda")
        view = buffer[1:].view(args[name].shape)  # contiguous, 4 bytes off 16-byte alignment
        view.copy_(args[name])
        args[name] = view
    _check(args, GRAD_TOL)


def test_deterministic() -> None:
    args = _large(seed=3, ratio_level="sequence", agg="seq-mean-token-mean")
    tensors, options = _split(args)
    first = kernels.forward(*tensors, **options)
    second = kernels.forward(*tensors, **options)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    one = torch.tensor(1.0, device="cuda")
    assert torch.equal(kernels.backward(one, *tensors, **options),
                       kernels.backward(one, *tensors, **options))


@pytest.mark.parametrize("shape", [(0, 5), (3, 0)])
def test_empty(shape: tuple[int, int]) -> None:
    args = _large(seed=1, batch=shape[0], length=shape[1])
    tensors, options = _split(args)
    with poisoned_allocations():
        loss, metrics = kernels.forward(*tensors, **options)
        grad = kernels.backward(torch.tensor(1.0, device="cuda"), *tensors, **options)
    assert loss.item() == 0.0 and torch.equal(metrics, torch.zeros(4, device="cuda"))
    assert grad.shape == shape


def test_public_op_runs_on_this_backend() -> None:
    args = _large(seed=7, batch=8, length=256)
    tensors, options = _split(args)
    logp = tensors[0].clone().requires_grad_(True)
    with rlk.use_backends("cuda", strict=True):  # raises rather than fall back to native
        loss, metrics = rlk.policy_loss(logp, *tensors[1:4], ref_logp=tensors[4],
                                        rollout_logp=tensors[5], **options)
        loss.backward()
    want_loss, want_metrics, want_grad = _reference(args)
    assert_matches("loss", loss, want_loss, TOL)
    assert_matches("clip_fraction", metrics["clip_fraction"], want_metrics[0], TOL)
    assert logp.grad is not None
    assert_matches("grad", logp.grad, want_grad, GRAD_TOL)
