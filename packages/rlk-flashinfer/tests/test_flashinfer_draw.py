"""The two-level inverse-CDF draw against exact expectations."""

from __future__ import annotations

import torch
from flashinfer_stats import chi_square, chi_square_critical

from rlk_flashinfer.draw import CHUNK, draw


def test_the_pick_follows_the_cumulative_weights_across_chunks():
    vocab = 3 * CHUNK + 5  # three whole chunks and a tail
    weights = torch.zeros(4, vocab)
    weights[:, [3, CHUNK + 1, 3 * CHUNK + 4]] = torch.tensor([1.0, 2.0, 1.0])
    u = torch.tensor([[0.0, 0.0], [0.3, 0.5], [0.6, 0.99], [0.999, 0.5]], dtype=torch.float64)
    tokens, total = draw(weights, u)
    assert tokens.tolist() == [3, CHUNK + 1, CHUNK + 1, 3 * CHUNK + 4]
    assert total.tolist() == [4.0] * 4


def test_entries_of_weight_zero_are_never_drawn():
    # tiny weights beside zeros: float cumulative sums could step over a zero entry
    weights = torch.zeros(1, 2 * CHUNK)
    weights[0, ::7] = 1e-30
    weights[0, 5] = 1.0
    u = torch.rand(5000, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    tokens, _ = draw(weights.expand(5000, -1), u)
    assert bool((weights[0, tokens] > 0).all())


def test_frequencies_follow_the_weights():
    gen = torch.Generator().manual_seed(5)
    probs = torch.rand(1, 2500, generator=gen) ** 6  # uneven, spread over three chunks
    probs[0, 1000:1500] = 0.0
    draws = 20000
    u = torch.rand(draws, 2, dtype=torch.float64, generator=gen)
    tokens, _ = draw(probs.expand(draws, -1), u)
    expected = probs[0].double() / probs.sum()
    statistic, dof = chi_square(tokens, expected)
    assert statistic < chi_square_critical(dof)
    assert bool((probs[0, tokens] > 0).all())


def test_a_vocabulary_smaller_than_a_chunk():
    weights = torch.tensor([[0.0, 0.0, 3.0], [1.0, 0.0, 0.0]])
    tokens, total = draw(weights, torch.full((2, 2), 0.7, dtype=torch.float64))
    assert tokens.tolist() == [2, 0]
    assert total.tolist() == [3.0, 1.0]
