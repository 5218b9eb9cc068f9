"""The log-prob functions rlk.integrations.trl puts in TRL's place, against TRL's own.

TRL's sdist ships no tests and CI reaches no repository, so these check the contract
TRL's tests check (shapes, dtypes, the naive log_softmax -> gather, entropy) against a
float64 reference, and TRL's chunked LM-head function side by side.
"""

from __future__ import annotations

import pytest
import torch

from rlk.integrations import trl as rlk_trl

from .conftest import require

trl_utils = require("trl.trainer.utils")
trl_kernels = require("trl.kernels")

TRL_SELECTIVE_LOG_SOFTMAX = trl_utils.selective_log_softmax
TRL_LOGP_AND_ENTROPY = trl_utils.selective_log_softmax_and_entropy
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3,
             torch.float64: 1e-12}


def reference_logp(logits: torch.Tensor, index: torch.Tensor, temperature: float = 1.0):
    logps = (logits.double() / temperature).log_softmax(-1)
    return logps.gather(-1, index.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("dtype", list(TOLERANCE))
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_selective_log_softmax(dtype: torch.dtype, temperature: float) -> None:
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(4, 32, 1024, generator=gen) * 3).to(dtype)
    index = torch.randint(0, 1024, (4, 32), generator=gen)
    got = rlk_trl.selective_log_softmax(logits, index, temperature=temperature)
    assert got.dtype == dtype and got.shape == index.shape
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.double(), reference_logp(logits, index, temperature),
                               rtol=tol, atol=tol)


def test_selective_log_softmax_row_mask_zeroes_value_and_gradient() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 5, 17, generator=gen, requires_grad=True)
    index = torch.randint(0, 17, (3, 5), generator=gen)
    row_mask = torch.rand(3, 5, generator=gen) > 0.4
    expected = TRL_SELECTIVE_LOG_SOFTMAX(logits, index, row_mask=row_mask)
    (expected_grad,) = torch.autograd.grad(expected.sum(), logits)
    got = rlk_trl.selective_log_softmax(logits, index, row_mask=row_mask)
    (got_grad,) = torch.autograd.grad(got.sum(), logits)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_grad, expected_grad, rtol=1e-5, atol=1e-5)
    assert bool((got[~row_mask] == 0).all()) and bool((got_grad[~row_mask] == 0).all())


@pytest.mark.parametrize("masked", [False, True], ids=["all", "row_mask"])
def test_selective_log_softmax_gathers_k_tokens_a_position(masked: bool) -> None:
    """An index [..., K] gathers K log-probs a position (TRL's top-K use), row_mask alike."""
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 3, 11, generator=gen, requires_grad=True)
    index = torch.randint(0, 11, (2, 3, 4), generator=gen)
    row_mask = (torch.rand(2, 3, 4, generator=gen) > 0.3) if masked else None
    expected = TRL_SELECTIVE_LOG_SOFTMAX(logits, index, temperature=0.8, row_mask=row_mask)
    (expected_grad,) = torch.autograd.grad(expected.sum(), logits)
    got = rlk_trl.selective_log_softmax(logits, index, temperature=0.8, row_mask=row_mask)
    (got_grad,) = torch.autograd.grad(got.sum(), logits)
    assert got.shape == index.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_grad, expected_grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("entropy_requires_grad", [True, False])
@pytest.mark.parametrize("masked", [False, True], ids=["all", "row_mask"])
def test_selective_log_softmax_and_entropy(entropy_requires_grad: bool, masked: bool) -> None:
    gen = torch.Generator().manual_seed(5)
    logits = (torch.randn(3, 7, 29, generator=gen) * 2).requires_grad_(True)
    index = torch.randint(0, 29, (3, 7), generator=gen)
    row_mask = (torch.rand(3, 7, generator=gen) > 0.3) if masked else None
    results = []
    for function in (TRL_LOGP_AND_ENTROPY, rlk_trl.selective_log_softmax_and_entropy):
        logp, entropy = function(logits, index, entropy_requires_grad=entropy_requires_grad,
                                 temperature=0.7, row_mask=row_mask)
        loss = logp.sum() + (0.5 * entropy.sum() if entropy.requires_grad else 0.0)
        results.append((logp, entropy, *torch.autograd.grad(loss, logits)))
    for got, expected in zip(results[1], results[0], strict=True):
        assert got.dtype == expected.dtype and got.requires_grad == expected.requires_grad
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(768,), (32, 768), (8, 16, 768), (2, 4, 8, 768)])
@pytest.mark.parametrize("dtype", list(TOLERANCE))
def test_entropy_from_logits(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    logits = (torch.randn(*shape, generator=torch.Generator().manual_seed(2)) * 2).to(dtype)
    got = rlk_trl.entropy_from_logits(logits, chunk_size=16)
    logps = logits.double().log_softmax(-1)
    expected = -(logps.exp() * logps).sum(-1)
    assert got.dtype == dtype and got.shape == shape[:-1]
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.double(), expected, rtol=tol, atol=tol)


def lm_head_inputs(seed: int = 3, rows: int = 37, width: int = 16, vocab: int = 50):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, width, generator=gen, requires_grad=True),
            (torch.randn(vocab, width, generator=gen) * 0.5).requires_grad_(True),
            (torch.randn(vocab, generator=gen) * 0.1).requires_grad_(True),
            torch.randint(0, vocab, (rows,), generator=gen))


def lm_head_outputs(function, inputs, temperature, softcap, scale, outputs):
    hidden, weight, bias, targets = inputs
    logp, entropy, *_ = function.apply(hidden, weight, bias, targets, temperature, 16, softcap,
                                       scale, outputs)
    loss = logp.sum() + (0 if entropy is None else 0.3 * entropy.sum())
    grads = torch.autograd.grad(loss, (hidden, weight, bias))
    return (logp, entropy, *grads)


@pytest.mark.parametrize("outputs", [("log_probs",), ("log_probs", "entropy")])
@pytest.mark.parametrize(("temperature", "softcap", "scale"),
                         [(1.0, None, 1.0), (0.7, None, 1.0), (1.0, 3.0, 1.0),
                          (0.9, 2.5, 0.5)])
def test_lm_head_function_matches_trl(outputs, temperature, softcap, scale) -> None:
    inputs = lm_head_inputs()
    want = lm_head_outputs(trl_kernels.ChunkedLogProbFunction, inputs, temperature, softcap,
                           scale, outputs)
    got = lm_head_outputs(rlk_trl.LinearLogProbs, inputs, temperature, softcap, scale, outputs)
    for name, have, expected in zip(("logp", "entropy", "hidden", "weight", "bias"), got,
                                    want, strict=True):
        if expected is None:
            assert have is None, name
        else:
            torch.testing.assert_close(have, expected, rtol=1e-5, atol=1e-5,
                                       msg=lambda m, n=name: f"{n}: {m}")


def test_lm_head_under_bf16_autocast_is_closer_to_float64_than_trl() -> None:
    """TRL rounds each logits tile to bfloat16; rlk keeps float32 logits from the bf16 GEMM."""
    hidden, weight, bias, targets = lm_head_inputs(rows=64, width=64, vocab=300)
    exact = reference_logp((hidden.bfloat16().double() @ weight.bfloat16().double().T
                            + bias.double()), targets)
    errors = {}
    for name, function in (("trl", trl_kernels.ChunkedLogProbFunction),
                           ("rlk", rlk_trl.LinearLogProbs)):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logp = function.apply(hidden, weight, bias, targets, 1.0, 128, None, 1.0,
                                  ("log_probs",))[0]
        errors[name] = float((logp.double() - exact).abs().max())
    assert errors["rlk"] <= errors["trl"], errors
    assert errors["rlk"] < 1e-2, errors


@pytest.mark.parametrize("outputs", [
    ("log_probs", "entropy", "is_top1"),  # SFTTrainer
    ("log_probs", "entropy", "mean_logits", "is_top1", "log_sum_sq_probs"),  # DPOTrainer (WPO)
    ("log_probs", "entropy", "mean_logits"),  # KTOTrainer
    rlk_trl.TRL_HEAD_DEFAULT_OUTPUTS,  # TRL's default
])
def test_lm_head_runs_trls_function_for_outputs_rlk_does_not_compute(outputs) -> None:
    """A call asking for more than log-probs and entropy gets TRL's own results, bit for bit."""
    hidden, weight, bias, targets = lm_head_inputs(seed=6)
    results = []
    for function in (trl_kernels.ChunkedLogProbFunction, rlk_trl.LinearLogProbs):
        values = function.apply(hidden, weight, bias, targets, 0.8, 16, 2.0, 0.5, outputs)
        differentiable = [value for value in values[:2] if value is not None]
        grads = torch.autograd.grad(sum(value.sum() for value in differentiable),
                                    (hidden, weight, bias))
        results.append((*values, *grads))
    assert sum(value is not None for value in results[0][:5]) == len(
        set(outputs) | {"log_probs"})
    for got, expected in zip(results[1], results[0], strict=True):
        assert (got is None) == (expected is None)
        if expected is not None:
            assert torch.equal(got, expected)
