"""policy_loss kernels against the float64 reference and the native code, outputs poisoned."""

from __future__ import annotations

from typing import Any

import pytest
import rlk
import torch
from rlk._runtime.spec import Tolerance, specs
from rlk.ops.policy_loss import native, reference
from rlk.ops.policy_loss.options import METRICS, PolicyLossOptions
from rlk.testing.compare import assert_matches
from rlk.testing.poison import poisoned_allocations

from rlk_cuda import policy_loss as kernels

pytestmark = pytest.mark.gpu
TENSORS = ("logp", "old_logp", "advantages", "mask", "ref_logp", "rollout_logp",
           "importance_weights")
TOL = Tolerance(atol=1e-5, rtol=1e-5)
GRAD_TOL = Tolerance(atol=1e-8, rtol=1e-4)  # gradients of the large cases are ~1 / tokens
SPEC = specs()["policy_loss"]
SAMPLES = [(dtype, sample.name) for dtype in SPEC.dtypes
           for sample in SPEC.samples(torch.device("cpu"), dtype)]


def _split(args: dict[str, Any]) -> tuple[list[Any], PolicyLossOptions]:
    return [args[name] for name in TENSORS], args["options"]


def _reference(args: dict[str, Any], grad_loss: float = 1.0) -> tuple[torch.Tensor, ...]:
    """float64 loss, metrics and d(loss * grad_loss)/d logp through autograd."""
    tensors, options = _split(args)
    leaf = tensors[0].detach().double().requires_grad_(True)
    loss, metrics = reference.policy_loss(leaf, *tensors[1:4], ref_logp=tensors[4],
                                          rollout_logp=tensors[5],
                                          importance_weights=tensors[6], options=options)
    (grad,) = torch.autograd.grad(loss * grad_loss, leaf, allow_unused=True)
    return loss.detach(), metrics, torch.zeros_like(leaf) if grad is None else grad


def _check(args: dict[str, Any], grad_tol: Tolerance) -> None:
    tensors, options = _split(args)
    want_loss, want_metrics, want_grad = _reference(args, grad_loss=0.75)
    upstream = torch.tensor(0.75, device="cuda")
    with poisoned_allocations():
        loss, metrics = kernels.forward(*tensors, options)
        grad = kernels.backward(upstream, *tensors, options)
    assert loss.shape == () and metrics.shape == (len(METRICS),)
    assert grad.shape == tensors[0].shape and grad.dtype == tensors[0].dtype
    assert_matches("loss", loss, want_loss, TOL)
    assert_matches("metrics", metrics, want_metrics, TOL)
    assert_matches("grad", grad, want_grad, grad_tol)
    native_loss, native_metrics = native.forward(*tensors, options)
    assert_matches("loss vs native", loss, native_loss, TOL)
    assert_matches("metrics vs native", metrics, native_metrics, TOL)


@pytest.mark.parametrize(("dtype", "name"), SAMPLES)
def test_conformance_samples(dtype: torch.dtype, name: str) -> None:
    (sample,) = [s for s in SPEC.samples(torch.device("cuda"), dtype) if s.name == name]
    assert SPEC.grad_tolerances is not None
    _check(dict(sample.args), SPEC.grad_tolerances[dtype])


def _large(seed: int, batch: int = 64, length: int = 4096, per_token: bool = False,
           logp_dtype: torch.dtype = torch.float32, mask_dtype: torch.dtype = torch.float32,
           weights: bool = False, **settings: Any) -> dict[str, Any]:
    """Log ratios on a grid of 1/64, so no ratio sits within rounding of a clip boundary."""
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def noise(scale: float) -> torch.Tensor:
        return torch.randn(batch, length, generator=gen, device="cuda") * scale

    def shift() -> torch.Tensor:
        steps = torch.randint(-24, 25, (batch, length), generator=gen, device="cuda")
        return steps.float() / 64

    logp = -noise(1.0).abs()
    logp = logp.to(logp_dtype).float()  # values the kernel reads exactly
    old = logp + shift()
    lengths = torch.randint(0, length + 1, (batch, 1), generator=gen, device="cuda")
    if batch > 1:
        lengths[0], lengths[1] = length, 0  # a full and an empty sequence
    mask = (torch.arange(length, device="cuda") < lengths).to(mask_dtype)
    adv_shape = (batch, length) if per_token else (batch,)
    args: dict[str, Any] = {
        "logp": logp.to(logp_dtype), "old_logp": old,
        "advantages": torch.randn(adv_shape, generator=gen, device="cuda"), "mask": mask,
        "ref_logp": logp + noise(0.3), "rollout_logp": old + shift(),
        "importance_weights": (torch.rand(batch, length, generator=gen, device="cuda") + 0.5
                               if weights else None),
    }
    base = {"clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.001}
    args["options"] = PolicyLossOptions(**{**base, **settings})
    return args


LARGE = {
    "dapo-k3-token-mean": {},
    "grpo-k2-seq-mean-token-mean": {"kl_estimator": "k2", "kl_coef": 0.04,
                                    "agg": "seq-mean-token-mean"},
    "gspo": {"ratio_level": "sequence", "clip_low": 3e-3, "clip_high": 4e-3, "kl_coef": 0.0,
             "agg": "seq-mean-token-mean"},
    "gspo-token-verl": {"ratio_level": "sequence-token", "clip_low": 3e-3, "clip_high": 4e-3,
                        "log_ratio_max": 10.0, "weights": True},
    "tis-dual-clip-per-token": {"per_token": True, "dual_clip": 1.4, "tis_cap": 1.1,
                                "agg": "seq-mean-token-sum"},
    "dr-grpo-k1": {"kl_estimator": "k1", "agg": "seq-mean-token-sum-norm"},
    "trl-dr-grpo": {"agg": "token-sum", "divisor": 64 * 4096.0, "scale": 0.5},
    "trl-grpo-empty-rows": {"agg": "seq-mean-token-mean", "count_empty_rows": True},
    "delta-k3-plus-bias": {"ratio_cap": 1.5, "kl_estimator": "k3+", "kl_coef": 0.05,
                           "kl_bias_correction": True},
    "verl-low-var-kl": {"kl_estimator": "k3", "kl_clamp": 10.0, "kl_coef": 0.1,
                        "log_ratio_min": -20.0, "log_ratio_max": 20.0},
    "abs-plus": {"kl_estimator": "abs+", "kl_coef": 0.1},
    "cispo-trl": {"objective": "cispo", "clip_low": 1.0, "clip_high": 4.0, "agg": "token-sum",
                  "divisor": 1e5},
    "cispo-verl": {"objective": "cispo", "log_ratio_min": -20.0, "log_ratio_max": 20.0,
                   "weights": True},
    "sapo": {"objective": "sapo", "agg": "seq-mean-token-mean", "per_token": True},
    "vespo": {"objective": "vespo", "agg": "token-sum", "divisor": 1e5, "tis_cap": 2.0,
              "weights": True},
    "bf16-logp-int64-mask": {"logp_dtype": torch.bfloat16, "mask_dtype": torch.int64,
                             "ratio_level": "sequence"},
    "f16-logp-bool-mask": {"logp_dtype": torch.float16, "mask_dtype": torch.bool},
}


@pytest.mark.parametrize("name", sorted(LARGE))
def test_large_batch(name: str) -> None:
    args = _large(seed=len(name), **LARGE[name])
    tolerance = GRAD_TOL
    dtype = args["logp"].dtype
    if dtype != torch.float32:  # the gradient is rounded to logp's dtype, subnormals too
        assert SPEC.grad_tolerances is not None
        info = torch.finfo(dtype)
        half_subnormal_step = info.smallest_normal * info.eps / 2  # 2**-25 for float16
        tolerance = Tolerance(atol=max(1e-8, half_subnormal_step),
                              rtol=SPEC.grad_tolerances[dtype].rtol)
    _check(args, tolerance)


@pytest.mark.parametrize("name", sorted(LARGE))
def test_forward_with_grad_is_forward_and_backward(name: str) -> None:
    """with_grad: the forward's loss and metrics, and a float32 gradient that times the upstream
    gradient, rounded to logp's dtype, is the backward's, bit for bit; every element written."""
    args = _large(seed=len(name) + 40, **LARGE[name])
    tensors, options = _split(args)
    upstream = torch.tensor(0.75, device="cuda")
    with poisoned_allocations():
        loss, metrics, grad = kernels.forward.with_grad(*tensors, options)
    assert grad.dtype == torch.float32 and grad.shape == tensors[0].shape
    want_loss, want_metrics = kernels.forward(*tensors, options)
    assert torch.equal(loss, want_loss) and torch.equal(metrics, want_metrics)
    scaled = torch.mul(grad, upstream, out=torch.empty_like(tensors[0]))
    assert torch.equal(scaled, kernels.backward(upstream, *tensors, options))


def test_masked_garbage_is_ignored() -> None:
    args = _large(seed=5, batch=8, length=4093, per_token=True, tis_cap=1.2, weights=True,
                  ratio_level="sequence")
    tensors, options = _split(args)
    dirty = [t.clone() for t in tensors]
    hidden = dirty[3] == 0
    for index, value in ((0, float("nan")), (1, float("inf")), (2, float("nan")),
                         (4, float("-inf")), (5, float("nan")), (6, float("inf"))):
        dirty[index][hidden] = value
    one = torch.tensor(1.0, device="cuda")
    clean_out = (*kernels.forward(*tensors, options), kernels.backward(one, *tensors, options))
    dirty_out = (*kernels.forward(*dirty, options), kernels.backward(one, *dirty, options))
    for clean, messy in zip(clean_out, dirty_out, strict=True):
        assert torch.equal(clean, messy)
    assert bool(clean_out[2][hidden].eq(0).all())


def test_overflow_and_nan_keep_masked_gradient_zero_and_poison_real_tokens() -> None:
    """#19: GSPO overflow gave NaN at masked tokens; a NaN logp gave a 0 gradient."""
    args = _large(seed=2, batch=4, length=256, ratio_level="sequence", kl_coef=0.0)
    tensors, options = _split(args)
    tensors[1][2] = tensors[0][2] - 200.0  # exp(200) overflows float32
    tensors[2][2] = -1.0
    tensors[0][3, 0] = float("nan")
    args["mask"][3, 0] = 1.0
    grad = kernels.backward(torch.tensor(1.0, device="cuda"), *tensors, options)
    real = tensors[3] != 0
    assert bool(grad[~real].eq(0).all())
    assert bool(grad[3][real[3]].isnan().all())  # the NaN spreads through its sequence ratio
    native_grad = native.backward(torch.tensor(1.0, device="cuda"), *tensors, options)
    assert torch.equal(native_grad.isnan(), grad.isnan())


def test_rows_starting_anywhere() -> None:
    """Contiguous tensors whose rows start off 16-byte boundaries read correctly."""
    args = _large(seed=9, batch=16, length=509)
    for name in ("logp", "old_logp", "mask"):
        buffer = torch.empty(args[name].numel() + 1, device="cuda")
        view = buffer[1:].view(args[name].shape)
        view.copy_(args[name])
        args[name] = view
    _check(args, GRAD_TOL)


def test_deterministic() -> None:
    args = _large(seed=3, ratio_level="sequence", agg="seq-mean-token-mean")
    tensors, options = _split(args)
    first = kernels.forward(*tensors, options)
    second = kernels.forward(*tensors, options)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    one = torch.tensor(1.0, device="cuda")
    assert torch.equal(kernels.backward(one, *tensors, options),
                       kernels.backward(one, *tensors, options))


@pytest.mark.parametrize("shape", [(0, 5), (3, 0)])
def test_empty(shape: tuple[int, int]) -> None:
    args = _large(seed=1, batch=shape[0], length=shape[1])
    tensors, options = _split(args)
    with poisoned_allocations():
        loss, metrics = kernels.forward(*tensors, options)
        grad = kernels.backward(torch.tensor(1.0, device="cuda"), *tensors, options)
        fused = kernels.forward.with_grad(*tensors, options)
    assert loss.item() == 0.0 and torch.equal(metrics, torch.zeros(len(METRICS), device="cuda"))
    assert grad.shape == shape and fused[2].shape == shape
    assert torch.equal(fused[0], loss) and torch.equal(fused[1], metrics)


def test_public_op_runs_on_this_backend_through_the_eager_path() -> None:
    args = _large(seed=7, batch=8, length=256)
    tensors, options = _split(args)
    logp = tensors[0].clone().requires_grad_(True)
    with rlk.use_backends("cuda", strict=True):  # raises rather than fall back to native
        loss, metrics = rlk.policy_loss(logp, *tensors[1:4], ref_logp=tensors[4],
                                        rollout_logp=tensors[5], options=options)
        assert type(loss.grad_fn).__name__ == "_KernelFunctionBackward"
        loss.backward()
    want_loss, want_metrics, want_grad = _reference(args)
    assert_matches("loss", loss, want_loss, TOL)
    assert_matches("clip_fraction", metrics["clip_fraction"], want_metrics[0], TOL)
    assert logp.grad is not None
    assert_matches("grad", logp.grad, want_grad, GRAD_TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_eager_backward_is_the_kernel_backward(dtype: torch.dtype) -> None:
    """The eager path runs with_grad and scales its gradient: at any upstream gradient, and
    again from a retained graph, that is this backend's backward kernel, bit for bit."""
    args = _large(seed=11, batch=16, length=512, logp_dtype=dtype, ratio_level="sequence",
                  agg="seq-mean-token-mean")
    tensors, options = _split(args)
    leaf = tensors[0].clone().requires_grad_(True)
    upstream = torch.tensor(0.3, device="cuda")
    with rlk.use_backends("cuda", strict=True):
        loss, _ = rlk.policy_loss(leaf, *tensors[1:4], ref_logp=tensors[4], options=options)
        (first,) = torch.autograd.grad(loss, leaf, upstream, retain_graph=True)
        (second,) = torch.autograd.grad(loss, leaf, upstream)
    want = kernels.backward(upstream, tensors[0], *tensors[1:4], tensors[4], None, None, options)
    assert torch.equal(loss, kernels.forward(tensors[0], *tensors[1:4], tensors[4], None, None,
                                             options)[0])
    assert torch.equal(first, want) and torch.equal(second, want)


def test_compiled_step_runs_the_torch_operator_on_this_backend() -> None:
    args = _large(seed=8, batch=8, length=256)
    tensors, options = _split(args)

    def step(x: torch.Tensor, kl_coef: float) -> torch.Tensor:
        return rlk.policy_loss(x, *tensors[1:4], ref_logp=tensors[4], options=options,
                               kl_coef=kl_coef)[0]

    with rlk.use_backends("cuda", strict=True):
        eager_x = tensors[0].clone().requires_grad_(True)
        step(eager_x, 0.01).backward()
        compiled_x = tensors[0].clone().requires_grad_(True)
        torch.compile(step, fullgraph=True, dynamic=True)(compiled_x, 0.01).backward()
    assert eager_x.grad is not None and compiled_x.grad is not None
    assert torch.equal(eager_x.grad, compiled_x.grad)
