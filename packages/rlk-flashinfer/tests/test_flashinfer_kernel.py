"""What the kernels write in place of the torch ops a call used to run (issue 18): the
greedy token, invalid rows, processed_logp, logp's NaN at -1; every output written over
poisoned buffers. Triton interpreted on CPU without a CUDA device (conftest)."""

from __future__ import annotations

import math

import pytest
import torch
from fake_flashinfer import FakeFlashInfer

import rlk
from rlk.ops.sample import reference

pytest.importorskip("triton")

from rlk_flashinfer import kernel  # needs triton
from rlk_flashinfer.sampler import _shortlists, sample

POISON_TOKEN, POISON_VALUE = 987654321, 1e30


def _seeds(batch: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(3)
    return torch.randint(-(2**62), 2**62, (batch,), generator=generator, dtype=torch.int64)


def _run(logits, temperature, top_k, top_p, min_p, with_processed=True):
    """The two launches into poisoned outputs, as sampler.sample makes them."""
    batch = logits.shape[0]
    tokens = torch.full((batch,), POISON_TOKEN, dtype=torch.int64)
    processed = torch.full((batch,), POISON_VALUE) if with_processed else None
    stats = kernel.statistics(logits, temperature or 1.0)
    shortlists = _shortlists(logits, 1024) if (top_k, top_p, min_p) != (0, 1.0, 0.0) else None
    kernel.sample(logits, _seeds(batch), stats, shortlists, temperature, top_k, top_p, min_p,
                  tokens, processed)
    return tokens, processed


def _greedy_rows() -> torch.Tensor:
    """Ties at the top inside a chunk and across chunks, signed zeros, masked columns."""
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(6, 9000, generator=generator)
    logits[0, [17, 4000]] = 9.0  # tie inside the first chunk
    logits[1, [8500, 5000]] = 9.0  # tie across chunks: the first chunk's wins
    logits[2] = -1.0
    logits[2, [6000, 300]] = torch.tensor([0.0, -0.0])  # -0.0 == 0.0: the first wins
    logits[3, :8999] = -math.inf  # only the last column is finite
    logits[4, 4095:4097] = 50.0  # a tie at a chunk boundary
    return logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_greedy_in_the_kernel_is_torch_argmax(dtype: torch.dtype):
    logits = _greedy_rows().to(dtype)
    tokens, processed = _run(logits, 0.0, 0, 1.0, 0.0)
    assert torch.equal(tokens, logits.float().argmax(-1))
    assert torch.equal(processed, torch.zeros(6))


def test_greedy_rows_without_a_valid_token_get_minus_one_and_nan():
    logits = _greedy_rows()
    logits[0, 3] = math.nan
    logits[1, 8000] = math.inf
    logits[2] = -math.inf
    tokens, processed = _run(logits, 0.0, 0, 1.0, 0.0)
    assert tokens[:3].tolist() == [-1, -1, -1]
    assert bool(processed[:3].isnan().all())
    assert torch.equal(tokens[3:], logits[3:].argmax(-1))


@pytest.mark.parametrize(("temperature", "top_k", "top_p", "min_p"),
                         [(0.8, 0, 1.0, 0.0), (0.8, 50, 0.9, 0.0), (0.8, 0, 0.95, 0.05),
                          (1.1, 0, 1.0, 0.2)])
def test_every_row_is_written_over_poison(fake: FakeFlashInfer, temperature, top_k, top_p,
                                         min_p):
    logits = torch.randn(5, 5000, generator=torch.Generator().manual_seed(6)) * 3
    logits[1] *= 0.001  # near flat: the whole-vocabulary path under every filter
    logits[2, 9] = math.nan
    plain = (top_k, top_p, min_p) == (0, 1.0, 0.0)
    tokens, processed = _run(logits, temperature, top_k, top_p, min_p, not plain)
    assert int(tokens[2]) == -1 and not bool((tokens == POISON_TOKEN).any())
    log_q = reference.sample_log_probs(logits, temperature=temperature, top_k=top_k,
                                       top_p=top_p, min_p=min_p)
    valid = torch.tensor([True, True, False, True, True])
    chosen = log_q[valid].gather(1, tokens[valid][:, None])[:, 0]
    assert bool(chosen.isfinite().all()), "a token outside the float64 kept set"
    if not plain:
        assert bool(processed[2].isnan())
        torch.testing.assert_close(processed[valid].double(), chosen, rtol=0, atol=2e-5)


def test_without_filters_processed_logp_is_a_copy_of_logp(fake: FakeFlashInfer):
    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(7))
    logits[1, 0] = math.nan
    _, logp, processed = sample(logits, 0.8, 0, 1.0, 0.0, _seeds(4))
    assert torch.equal(processed.isnan(), logp.isnan()) and bool(logp[1].isnan())
    assert torch.equal(processed[logp.isfinite()], logp[logp.isfinite()])
    assert processed.data_ptr() != logp.data_ptr()  # not one tensor returned twice


@pytest.mark.parametrize("checks", [False, True])
def test_logp_of_a_row_without_a_token_is_nan_with_or_without_input_checks(
        fake: FakeFlashInfer, monkeypatch: pytest.MonkeyPatch, checks: bool):
    """logp at token -1 is NaN by the logp contract (tokens outside [0, V)); rlk.logp's input
    checks, which would refuse -1, never run on the drawn tokens."""
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(8))
    logits[0] = -math.inf
    monkeypatch.setenv("RLK_CHECK_INPUTS", "1" if checks else "0")
    for temperature in (0.0, 0.9):
        tokens, logp, _ = sample(logits, temperature, 0, 0.9, 0.0, _seeds(3))
        assert int(tokens[0]) == -1 and bool(logp[0].isnan())
        at = temperature or 1.0
        assert torch.equal(logp[1:], rlk.logp(logits[1:], tokens[1:], temperature=at))
