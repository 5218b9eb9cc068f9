"""The public sample: distribution, per-row seeds, logp identities, invalid rows, errors."""

from __future__ import annotations

import math

import pytest
import torch

import rlk
from rlk.ops.sample import op as sample_op
from rlk.ops.sample import reference

GEN = torch.Generator().manual_seed(23)


def _logits(rows: int = 8, vocab: int = 40, dtype=torch.float32, scale: float = 2.0):
    return (torch.randn(rows, vocab, generator=GEN) * scale).to(dtype)


def _seeds(rows: int) -> torch.Tensor:
    return torch.randint(-(2**62), 2**62, (rows,), generator=GEN)


OPTIONS = [
    {},
    {"temperature": 0.7},
    {"top_k": 6},
    {"top_p": 0.8},
    {"min_p": 0.05},
    {"temperature": 1.4, "top_k": 12, "top_p": 0.9, "min_p": 0.01},
]


def _chi_square_bound(df: int, z: float = 4.75) -> float:
    """Wilson-Hilferty upper quantile of chi-square(df) at ~1e-6 tail."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("options", OPTIONS[1:])
def test_frequencies_match_the_truncated_distribution(options):
    """Many seeds on one row: a chi-square test against the float64 truncated distribution.

    The seeds are fixed, so the test is deterministic; the bound is a 1e-6 tail.
    """
    draws, vocab = 30_000, 14
    row = _logits(1, vocab, scale=1.2)
    result = rlk.sample(row.expand(draws, vocab), seed=torch.arange(draws) * 7919, **options)
    probs = reference.sample_log_probs(row, **options)[0].exp()
    support = probs > 0
    counts = torch.bincount(result.tokens, minlength=vocab).double()
    assert counts[~support].sum() == 0, "a token outside the truncated support was drawn"
    expected = probs[support] * draws
    chi2 = float(((counts[support] - expected) ** 2 / expected).sum())
    df = int(support.sum()) - 1
    assert df >= 1, "options leave a single token: nothing to test"
    assert chi2 < _chi_square_bound(df), f"chi2={chi2:.1f} for df={df}"


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logp_is_rlk_logp_bit_for_bit_and_processed_logp_matches_reference(options, dtype):
    logits = _logits(16, 64, dtype=dtype)
    result = rlk.sample(logits, seed=_seeds(16), **options)
    temperature = options.get("temperature", 1.0)
    assert torch.equal(result.logp, rlk.logp(logits, result.tokens, temperature=temperature))
    log_q = reference.sample_log_probs(logits, **options)
    want = log_q.gather(1, result.tokens.unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(result.processed_logp.double(), want, atol=2e-5, rtol=0)
    assert result.tokens.dtype == torch.int64 and result.logp.dtype == torch.float32


def test_greedy_takes_the_first_maximum_and_ignores_filters():
    logits = _logits(10, 30)
    logits[2, 7] = logits[2, 9] = logits[2].max() + 1.0  # a tie: the first index wins
    result = rlk.sample(logits, temperature=0.0, top_k=3, top_p=0.2, min_p=0.5, seed=3)
    assert torch.equal(result.tokens, logits.argmax(dim=1)) and result.tokens[2] == 7
    assert torch.equal(result.processed_logp, torch.zeros(10))
    assert torch.equal(result.logp, rlk.logp(logits, result.tokens))


@pytest.mark.parametrize("temperature", [2.0**-126, 1e-30, 1e-6])
def test_tied_maxima_at_a_tiny_temperature_share_the_mass(temperature):
    """Issue #31 F3: at T = 2^-126 the float64 reference divided before shifting, and the
    log of the tie count vanished in the rounding of x / T (0.0 where -log 2 is right)."""
    logits = torch.randn(6, 30, generator=torch.Generator().manual_seed(3))
    top = logits.amax(dim=1)
    logits[:, 7] = top
    logits[:3, 19] = top[:3]  # rows 0-2: two tokens tied at the max; rows 3-5: one
    ties = (logits == logits.amax(dim=1, keepdim=True)).sum(dim=1).double()
    want = reference.sample_log_probs(logits, temperature=temperature)
    torch.testing.assert_close(want.max(dim=1).values, -ties.log(), rtol=0, atol=1e-12)
    result = rlk.sample(logits, temperature=temperature, seed=_seeds(6))
    picked = want.gather(1, result.tokens.unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(result.processed_logp.double(), picked, rtol=0, atol=1e-6)


def test_a_rows_result_depends_only_on_its_logits_and_seed():
    logits, seeds = _logits(12, 200), _seeds(12)
    full = rlk.sample(logits, seed=seeds, top_p=0.95, top_k=50)
    perm = torch.randperm(12, generator=GEN)
    shuffled = rlk.sample(logits[perm], seed=seeds[perm], top_p=0.95, top_k=50)
    assert torch.equal(shuffled.tokens, full.tokens[perm])
    for row in (0, 5, 11):
        alone = rlk.sample(logits[row : row + 1], seed=seeds[row : row + 1], top_p=0.95,
                           top_k=50)
        assert alone.tokens[0] == full.tokens[row]
    # the same logits under different seeds do not all draw the same token
    same = rlk.sample(logits[:1].expand(64, 200), seed=torch.arange(64))
    assert same.tokens.unique().numel() > 5


def test_int_and_default_seeds_are_reproducible():
    logits = _logits(32, 100)
    first, again = rlk.sample(logits, seed=5), rlk.sample(logits, seed=5)
    assert torch.equal(first.tokens, again.tokens)
    assert not torch.equal(first.tokens, rlk.sample(logits, seed=6).tokens)
    # rows of seed s are unrelated to rows of seed s + 1 (no shifted streams)
    shifted = rlk.sample(logits[1:2].expand(32, 100).contiguous(), seed=6)
    ref = rlk.sample(logits[1:2].expand(32, 100).contiguous(), seed=5)
    assert not torch.equal(shifted.tokens[:-1], ref.tokens[1:])
    torch.manual_seed(0)
    drawn = rlk.sample(logits).tokens
    torch.manual_seed(0)
    assert torch.equal(rlk.sample(logits).tokens, drawn)


def test_rows_without_a_valid_token_give_minus_one_and_nan_alone():
    logits = _logits(6, 20)
    logits[1, 3] = float("nan")
    logits[2] = float("-inf")
    logits[4, 0] = float("inf")
    logits[5, :15] = float("-inf")  # partly -inf: still valid
    for temperature in (1.0, 0.0):
        result = rlk.sample(logits, temperature=temperature, top_p=0.9, seed=_seeds(6))
        assert result.tokens[[1, 2, 4]].tolist() == [-1, -1, -1]
        assert torch.isnan(result.logp[[1, 2, 4]]).all()
        assert torch.isnan(result.processed_logp[[1, 2, 4]]).all()
        assert (result.tokens[[0, 3]] >= 0).all() and (result.tokens[5] >= 15)
        assert torch.isfinite(result.processed_logp[[0, 3, 5]]).all()


def test_leading_dimensions_and_empty_input():
    logits = _logits(6, 30).view(2, 3, 30)
    seeds = _seeds(6).view(2, 3)
    result = rlk.sample(logits, seed=seeds, top_k=4)
    assert result.tokens.shape == result.logp.shape == result.processed_logp.shape == (2, 3)
    flat = rlk.sample(logits.view(6, 30), seed=seeds.view(6), top_k=4)
    assert torch.equal(result.tokens.view(6), flat.tokens)
    empty = rlk.sample(torch.zeros(0, 30), seed=torch.zeros(0, dtype=torch.int64))
    assert empty.tokens.shape == (0,)


def test_hash_uniforms_are_uniform_and_seed_sensitive():
    from rlk.ops.sample.native import uniforms

    u = uniforms(torch.tensor([0, 1, -1, 2**62]), 50_000)
    assert ((u > 0) & (u < 1)).all()
    counts = torch.histc(u, bins=20, min=0.0, max=1.0)
    expected = u.numel() / 20
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < _chi_square_bound(19)
    assert (u[0] != u[1]).float().mean() > 0.999 and (u[2] != u[3]).float().mean() > 0.999


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"temperature": -0.5}, ValueError, r"temperature must be finite and >= 0 \(0 = greedy\)"),
        ({"top_k": -1}, ValueError, r"top_k must be >= 0 \(0 = off\); got -1"),
        ({"top_k": 2.5}, TypeError, "top_k must be an int"),
        ({"top_p": 0.0}, ValueError, r"top_p must be in \(0, 1\]"),
        ({"top_p": 1.5}, ValueError, r"top_p must be in \(0, 1\]"),
        ({"min_p": 1.0}, ValueError, r"min_p must be in \[0, 1\)"),
        ({"seed": torch.zeros(3, dtype=torch.int64)}, ValueError,
         r"seed must have shape \(4,\)"),
        ({"seed": torch.zeros(4, dtype=torch.int32)}, TypeError, "seed must have dtype int64"),
        ({"seed": 1.5}, TypeError, "seed must be None, an int or an int64 tensor"),
    ],
)
def test_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        rlk.sample(_logits(4, 10), **kwargs)


def test_logits_must_be_floating_with_a_vocabulary():
    with pytest.raises(TypeError, match="logits must have dtype"):
        rlk.sample(torch.zeros(2, 5, dtype=torch.int64))
    with pytest.raises(ValueError, match="V >= 1"):
        rlk.sample(torch.zeros(2, 0))


def test_torch_compile_fullgraph_and_opcheck():
    logits, seeds = _logits(8, 64), _seeds(8)

    def draw(x):
        result = rlk.sample(x, temperature=0.8, top_k=10, top_p=0.9, min_p=0.01, seed=seeds)
        return result.tokens, result.logp, result.processed_logp

    for got, want in zip(torch.compile(draw, fullgraph=True)(logits), draw(logits),
                         strict=True):
        assert torch.equal(got, want)
    torch.library.opcheck(torch.ops.rlk.sample.default, (logits, 0.8, 10, 0.9, 0.01, seeds))


def test_outputs_carry_no_autograd_history():
    logits = _logits(3, 10).requires_grad_(True)
    result = rlk.sample(logits, seed=1)
    assert not result.logp.requires_grad and not result.processed_logp.requires_grad


def test_uniforms_stay_strictly_inside_the_unit_interval():
    from rlk.ops.sample.native import unit_interval

    extremes = unit_interval(torch.tensor([0, 1, 511, 512, 2**32 - 512, 2**32 - 1]))
    assert bool((extremes > 0).all()) and bool((extremes < 1).all())


def test_large_vocabulary_never_samples_outside_the_support():
    """Regression: with V ~ 150k, a uniform rounding to 1.0 let filtered tokens win ~1% of rows."""
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(64, 151936, generator=gen) * 2
    tokens, _, processed = rlk.sample(logits, top_k=50, top_p=0.9, seed=torch.arange(64) + 110)
    log_q = reference.sample_log_probs(logits, temperature=1.0, top_k=50, top_p=0.9, min_p=0.0)
    assert bool((log_q.gather(1, tokens.unsqueeze(1)) > -torch.inf).all())
    assert bool(torch.isfinite(processed).all())


def test_default_row_seeds_share_their_high_bits_in_runs_of_64():
    # FlashInfer keys one launch by a seed's high 58 bits: default seeds must not need a
    # launch per row, and still be distinct per row and fresh per call.
    first = sample_op._seeds(None, (130,), torch.device("cpu"))
    assert first.unique().numel() == 130
    assert (first >> 6).unique().numel() == 3
    assert not torch.equal(first, sample_op._seeds(None, (130,), torch.device("cpu")))
