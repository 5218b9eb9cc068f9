"""The `vllm` backend's sample kernel against a float64 reference of the filtered distribution."""

from __future__ import annotations

import pytest
import torch

import rlk
from rlk.config import reset_check_inputs

pytestmark = pytest.mark.vllm


def reference_distribution(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float
) -> torch.Tensor:
    """float64 probabilities after temperature, top-k, top-p, then min-p (rlk's order)."""
    x = logits.double() / temperature
    vocab = x.shape[-1]
    if 0 < top_k < vocab:
        kth = x.topk(top_k, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        probs = x.softmax(-1)
        # Keep a token while the mass of strictly more likely tokens is below top_p.
        larger = (probs[:, None, :] * (probs[:, None, :] > probs[:, :, None])).sum(-1)
        x = x.masked_fill(larger >= top_p, float("-inf"))
    if min_p > 0.0:
        probs = x.softmax(-1)
        x = x.masked_fill(probs < min_p * probs.amax(-1, keepdim=True), float("-inf"))
    return x.softmax(-1)


def kernel(*args: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from rlk_vllm.sampling import sample

    return sample(*args)  # type: ignore[arg-type]


SETTINGS = [
    (1.0, 0, 1.0, 0.0),
    (0.7, 20, 1.0, 0.0),
    (1.3, 0, 0.8, 0.0),
    (0.9, 0, 1.0, 0.1),
    (0.8, 40, 0.9, 0.05),
]


@pytest.mark.parametrize(("temperature", "top_k", "top_p", "min_p"), SETTINGS)
def test_tokens_probabilities_and_logp(temperature: float, top_k: int, top_p: float,
                                       min_p: float) -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(64, 300, generator=gen) * 3
    seeds = torch.randint(0, 2**62, (64,), generator=gen)
    tokens, logp, processed = kernel(logits, temperature, top_k, top_p, min_p, seeds)
    assert tokens.dtype == torch.int64 and logp.dtype == processed.dtype == torch.float32
    probs = reference_distribution(logits, temperature, top_k, top_p, min_p)
    chosen = probs.gather(1, tokens[:, None]).squeeze(1)
    assert (chosen > 0).all(), "a token outside the filtered support was drawn"
    assert torch.allclose(processed.double(), chosen.log(), atol=1e-5, rtol=0)
    same = rlk.logp(logits, tokens, temperature=temperature)
    assert torch.equal(logp, same), "logp is not bit-identical to rlk.logp"
    again = kernel(logits, temperature, top_k, top_p, min_p, seeds)
    assert torch.equal(again[0], tokens)


def test_empirical_distribution_matches_the_reference() -> None:
    row = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0]])
    draws = 4000
    logits = row.expand(draws, -1).contiguous()
    seeds = torch.arange(draws, dtype=torch.int64) * 7919 + 11
    tokens, _, _ = kernel(logits, 0.9, 6, 0.95, 0.02, seeds)
    probs = reference_distribution(row, 0.9, 6, 0.95, 0.02)[0]
    freq = torch.bincount(tokens, minlength=8).double() / draws
    # 4 standard errors of a frequency estimated from 4000 draws.
    assert (freq - probs).abs().max() < 4 * (0.25 / draws) ** 0.5, (freq, probs)
    assert freq[probs == 0].sum() == 0


def test_a_rows_token_depends_only_on_its_logits_and_seed() -> None:
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(16, 500, generator=gen)
    seeds = torch.randint(-2**40, 2**40, (16,), generator=gen)
    tokens, _, _ = kernel(logits, 1.0, 0, 0.9, 0.0, seeds)
    for r in (0, 7, 15):
        alone, _, _ = kernel(logits[r:r + 1], 1.0, 0, 0.9, 0.0, seeds[r:r + 1])
        assert alone.item() == tokens[r].item()
    reordered, _, _ = kernel(logits.flip(0), 1.0, 0, 0.9, 0.0, seeds.flip(0))
    assert torch.equal(reordered.flip(0), tokens)
    other, _, _ = kernel(logits, 1.0, 0, 0.9, 0.0, seeds + 1)
    assert not torch.equal(other, tokens)


def test_greedy() -> None:
    logits = torch.randn(10, 77, generator=torch.Generator().manual_seed(8))
    tokens, logp, processed = kernel(logits, 0.0, 5, 0.5, 0.3, torch.zeros(10, dtype=torch.int64))
    assert torch.equal(tokens, logits.argmax(-1))
    assert torch.equal(logp, rlk.logp(logits, tokens, temperature=1.0))
    assert torch.equal(processed, torch.zeros(10))


def test_rows_without_a_valid_token() -> None:
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(9))
    logits[1] = float("-inf")
    logits[2, 13] = float("nan")
    logits[4, 7] = float("inf")
    tokens, logp, processed = kernel(logits, 0.8, 0, 1.0, 0.0, torch.arange(5))
    assert tokens[[1, 2, 4]].tolist() == [-1, -1, -1]
    assert logp[[1, 2, 4]].isnan().all() and processed[[1, 2, 4]].isnan().all()
    assert (tokens[[0, 3]] >= 0).all() and logp[[0, 3]].isfinite().all()
    assert processed[[0, 3]].isfinite().all()
    rlk.check_inputs(True)  # the -1 rows must not trip the range check
    try:
        checked = kernel(logits, 0.8, 0, 1.0, 0.0, torch.arange(5))
    finally:
        reset_check_inputs()
    assert torch.equal(checked[0], tokens)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits(dtype: torch.dtype) -> None:
    logits = (torch.randn(12, 256, generator=torch.Generator().manual_seed(10)) * 2).to(dtype)
    tokens, logp, processed = kernel(logits, 0.7, 30, 1.0, 0.0, torch.arange(12) + 100)
    assert torch.equal(logp, rlk.logp(logits, tokens, temperature=0.7))
    probs = reference_distribution(logits.float(), 0.7, 30, 1.0, 0.0)
    assert torch.allclose(processed.double(), probs.gather(1, tokens[:, None]).squeeze(1).log(),
                          atol=1e-5, rtol=0)


def test_tokens_tied_at_the_top_p_cut_are_all_kept() -> None:
    # Masses 0.58, 0.21, 0.21 (+ a tail): top_p=0.7 cuts between the two tied tokens.
    row = torch.tensor([[2.0, 1.0, 1.0, -6.0, -6.0]])
    logits = row.expand(400, -1).contiguous()
    tokens, _, processed = kernel(logits, 1.0, 0, 0.7, 0.0, torch.arange(400))
    kept = torch.tensor([2.0, 1.0, 1.0]).double().log_softmax(-1)
    assert set(tokens.tolist()) == {0, 1, 2}
    assert torch.allclose(processed.double(), kept[tokens], atol=1e-6, rtol=0)


def test_public_sample_dispatches_to_vllm_when_preferred() -> None:
    logits = torch.randn(6, 90, generator=torch.Generator().manual_seed(12))
    seeds = torch.arange(6, dtype=torch.int64) * 31
    with rlk.use_backends("vllm", strict=True):
        assert rlk.explain("sample", logits, temperature=0.9, top_k=10, seed=seeds).backend == (
            "vllm")
        tokens, logp, processed = rlk.sample(logits, temperature=0.9, top_k=10, seed=seeds)
    want = kernel(logits, 0.9, 10, 1.0, 0.0, seeds)
    assert torch.equal(tokens, want[0]) and torch.equal(logp, want[1])
    assert torch.equal(processed, want[2])
