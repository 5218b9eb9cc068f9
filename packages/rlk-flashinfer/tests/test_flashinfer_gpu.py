"""The backend against the real FlashInfer on a CUDA device (marker `gpu`; skipped elsewhere).

Includes the seed's temperature regression: sampled frequencies must follow
softmax(logits / T) at T != 1, which fails if temperature is applied twice or not at all.
"""

from __future__ import annotations

import math

import pytest
import torch
from flashinfer_stats import chi_square, chi_square_critical

import rlk
from rlk.ops.sample import reference
from rlk_flashinfer.probe import probe

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)
pytest.importorskip("flashinfer")
pytest.importorskip("triton")

from rlk_flashinfer.sampler import sample  # noqa: E402  (needs triton)

DEVICE = torch.device("cuda")


def _logits(batch: int, vocab: int, scale: float, dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    return (torch.randn(batch, vocab, generator=generator, device=DEVICE) * scale).to(dtype)


def _random_seeds(batch: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(-(2**62), 2**62, (batch,), generator=generator,
                         dtype=torch.int64).to(DEVICE)


def test_probe_accepts_this_machine():
    assert probe(DEVICE) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
def test_temperature_regression_frequencies(temperature: float, dtype: torch.dtype):
    row = _logits(1, 16, 0.7, dtype, seed=11)
    draws = 20000
    seeds = torch.arange(draws, dtype=torch.int64, device=DEVICE) + 7 * 2**40
    tokens, logp, processed = sample(row.expand(draws, -1), temperature, 0, 1.0, 0.0, seeds)
    assert torch.equal(processed, logp)  # no filter: the kept set is the whole vocabulary
    right = torch.softmax(row[0].double() / temperature, -1).cpu()
    statistic, dof = chi_square(tokens.cpu(), right)
    assert statistic < chi_square_critical(dof), (temperature, statistic, dof)
    if temperature != 1.0:
        twice = torch.softmax(row[0].double() / temperature**2, -1).cpu()
        assert chi_square(tokens.cpu(), twice)[0] > chi_square_critical(dof)


@pytest.mark.parametrize(("top_k", "top_p", "min_p"), [(6, 1.0, 0.0), (0, 0.8, 0.0),
                                                       (0, 1.0, 0.1), (8, 0.9, 0.05)])
def test_truncated_frequencies(top_k: int, top_p: float, min_p: float):
    row = _logits(1, 24, 1.2, torch.float32, seed=12)
    draws = 20000
    seeds = _random_seeds(draws, seed=3)  # one launch per row: exercises slot placement
    tokens, _, processed = sample(row.expand(draws, -1), 1.7, top_k, top_p, min_p, seeds)
    log_q = reference.sample_log_probs(row.cpu(), temperature=1.7, top_k=top_k, top_p=top_p,
                                       min_p=min_p)[0]
    tokens = tokens.cpu()
    assert bool(log_q[tokens].isfinite().all()), "drew a token outside the kept set"
    statistic, dof = chi_square(tokens, log_q.exp())
    assert statistic < chi_square_critical(dof), statistic
    torch.testing.assert_close(processed.cpu().double(), log_q[tokens], rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("temperature", [0.0, 0.6, 1.3])
def test_logp_is_rlk_logp_bit_for_bit(dtype: torch.dtype, temperature: float):
    logits = _logits(64, 151936, 3.0, dtype, seed=13)
    tokens, logp, processed = sample(logits, temperature, 50, 0.95, 0.0, _random_seeds(64, 4))
    assert bool((tokens >= 0).all()) and bool(processed.isfinite().all())
    at = temperature if temperature > 0 else 1.0
    assert torch.equal(logp, rlk.logp(logits, tokens, temperature=at))
    if temperature == 0.0:
        assert torch.equal(tokens, logits.argmax(-1))


def test_processed_logp_against_float64_reference():
    # bf16 logits tie often; the kept sets must keep ties at the top-k and top-p boundaries.
    logits = _logits(128, 4096, 3.0, torch.bfloat16, seed=14)
    tokens, _, processed = sample(logits, 0.9, 40, 0.9, 0.02, _random_seeds(128, 5))
    log_q = reference.sample_log_probs(logits.cpu(), temperature=0.9, top_k=40, top_p=0.9,
                                       min_p=0.02)
    chosen = log_q.gather(1, tokens.cpu()[:, None])[:, 0]
    assert bool(chosen.isfinite().all())
    torch.testing.assert_close(processed.cpu().double(), chosen, rtol=0, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ties_at_the_top_p_boundary_are_kept_together(dtype: torch.dtype):
    # probs 0.52, 0.19, 0.19, 0.07, 0.03: tokens 1 and 2 tie where the nucleus (0.6) ends.
    logits = torch.tensor([[2.0, 1.0, 1.0, 0.0, -1.0]], device=DEVICE, dtype=dtype)
    draws = 2000
    tokens, _, processed = sample(logits.expand(draws, -1), 1.0, 0, 0.6, 0.0,
                                  _random_seeds(draws, 9))
    tokens = tokens.cpu()
    assert set(tokens.tolist()) == {0, 1, 2}
    log_q = reference.sample_log_probs(logits.cpu(), top_p=0.6)[0]
    torch.testing.assert_close(processed.cpu().double(), log_q[tokens], rtol=0, atol=1e-5)


def test_a_row_depends_only_on_its_logits_and_seed():
    logits = _logits(300, 32000, 2.0, torch.bfloat16, seed=15)
    seeds = torch.cat([_random_seeds(200, 6),
                       torch.arange(100, dtype=torch.int64, device=DEVICE) + 5000])
    tokens, _, _ = sample(logits, 1.0, 0, 0.95, 0.0, seeds)
    order = torch.randperm(300, generator=torch.Generator().manual_seed(1))
    order = order.to(DEVICE)
    shuffled, _, _ = sample(logits[order], 1.0, 0, 0.95, 0.0, seeds[order])
    assert torch.equal(shuffled, tokens[order])
    for row in (0, 57, 199, 200, 299):
        alone, _, _ = sample(logits[row:row + 1], 1.0, 0, 0.95, 0.0, seeds[row:row + 1])
        assert int(alone) == int(tokens[row])


def test_rows_without_a_valid_token():
    logits = _logits(8, 1000, 2.0, torch.float32, seed=16)
    logits[2] = -math.inf
    logits[5, 17] = math.nan
    for temperature in (0.0, 0.8):
        tokens, logp, processed = sample(logits, temperature, 0, 1.0, 0.0, _random_seeds(8, 7))
        bad = torch.zeros(8, dtype=torch.bool, device=DEVICE)
        bad[[2, 5]] = True
        assert tokens[bad].tolist() == [-1, -1]
        assert bool(logp[bad].isnan().all()) and bool(processed[bad].isnan().all())
        assert bool((tokens[~bad] >= 0).all()) and bool(logp[~bad].isfinite().all())


def test_strided_logits_give_the_same_tokens():
    logits = _logits(48, 5000, 2.0, torch.float32, seed=17)
    seeds = _random_seeds(48, 8)
    dense = sample(logits, 0.7, 20, 0.9, 0.0, seeds)
    strided = sample(logits.t().contiguous().t(), 0.7, 20, 0.9, 0.0, seeds)
    for left, right in zip(dense, strided, strict=True):
        assert torch.equal(left, right)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_shortlist_and_full_vocabulary_rows_in_one_batch(dtype: torch.dtype):
    """Peaked rows are served from FlashInfer's top-k, flat ones by the renormalisations; a
    row's token is the same alone, and processed_logp matches float64 on both paths."""
    logits = _logits(64, 32000, 3.0, torch.float32, seed=18)
    logits[1::4] *= 0.02  # flat: min-p 0.02 keeps most of the vocabulary
    logits = logits.to(dtype)
    seeds = _random_seeds(64, 9)
    tokens, logp, processed = sample(logits, 1.0, 0, 0.9, 0.02, seeds)
    log_q = reference.sample_log_probs(logits.cpu(), top_p=0.9, min_p=0.02)
    chosen = log_q.gather(1, tokens.cpu()[:, None])[:, 0]
    assert bool(chosen.isfinite().all()), "a token outside the kept set was drawn"
    torch.testing.assert_close(processed.cpu().double(), chosen, rtol=0, atol=1e-5)
    assert torch.equal(logp, rlk.logp(logits, tokens, temperature=1.0))
    for row in (0, 1, 2, 5, 63):
        alone, _, _ = sample(logits[row:row + 1], 1.0, 0, 0.9, 0.02, seeds[row:row + 1])
        assert int(alone) == int(tokens[row])


def test_changing_top_k_does_not_recompile():
    """top_k and the shortlist length are not specialised on: a new value reuses the kernel."""
    from rlk_flashinfer import kernel

    logits = _logits(8, 5000, 3.0, torch.float32, seed=19)
    seeds = _random_seeds(8, 10)
    sample(logits, 1.0, 50, 1.0, 0.0, seeds)
    cache = kernel.sample_rows.device_caches[torch.cuda.current_device()][0]
    compiled = len(cache)
    for top_k in (51, 64, 17, 1, 900):  # shortlists of 1024 entries: one block size
        sample(logits, 1.0, top_k, 1.0, 0.0, seeds)
    assert len(cache) == compiled
