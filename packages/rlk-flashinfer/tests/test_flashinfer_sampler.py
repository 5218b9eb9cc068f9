"""The `sample` kernel against a fake flashinfer on CPU, its Triton kernels interpreted:
mapping, paths, temperature, seeds, edges. Batches are small: the interpreter runs each
program in Python."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from fake_flashinfer import FakeFlashInfer
from flashinfer_stats import chi_square, chi_square_critical

import rlk
from rlk.ops.sample import reference
from rlk_flashinfer import sampler
from rlk_flashinfer.sampler import sample

pytest.importorskip("triton")  # the kernels; interpreted without a CUDA device (conftest)


def _logits(batch: int, vocab: int, seed: int = 0, dtype: torch.dtype = torch.float32):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, vocab, generator=generator) * 2.0).to(dtype)


def _seeds(batch: int, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(-(2**62), 2**62, (batch,), generator=generator, dtype=torch.int64)


def _matches_reference(logits, tokens, processed, atol=2e-6, **options):
    log_q = reference.sample_log_probs(logits, **options)
    chosen = log_q.gather(1, tokens[:, None])[:, 0]
    assert bool(chosen.isfinite().all()), "a token outside the kept set was drawn"
    torch.testing.assert_close(processed.double(), chosen, rtol=0, atol=atol)


# --- paths -----------------------------------------------------------------------------


FILTERS = [(0, 1.0, 0.0), (7, 1.0, 0.0), (3000, 1.0, 0.0), (0, 0.8, 0.0), (0, 1.0, 0.1),
           (5, 0.9, 0.05)]


@pytest.mark.parametrize(("top_k", "top_p", "min_p"), FILTERS)
def test_rows_whose_kept_set_fits_the_shortlist_take_one_top_k(fake: FakeFlashInfer, top_k: int,
                                                               top_p: float, min_p: float):
    logits = _logits(3, 3000)  # std 2: every filter keeps far fewer than 1024 tokens
    tokens, _, processed = sample(logits, 1.3, top_k, top_p, min_p, _seeds(3))
    no_filter = (0 < top_k < 3000, top_p < 1.0, min_p > 0.0) == (False, False, False)
    assert fake.names() == ([] if no_filter else ["top_k"])
    if not no_filter:
        assert fake.calls[0].kwargs == {"k": 1024, "sorted": False, "deterministic": True}
    _matches_reference(logits, tokens, processed, temperature=1.3, top_k=top_k, top_p=top_p,
                       min_p=min_p)


@pytest.mark.parametrize(("top_k", "top_p", "min_p"), [(7, 1.0, 0.0), (0, 0.8, 0.0),
                                                       (0, 1.0, 0.1), (5, 0.9, 0.05)])
def test_rows_past_the_shortlist_take_the_full_vocabulary(fake: FakeFlashInfer, top_k: int,
                                                          top_p: float, min_p: float):
    logits = torch.zeros(2, 1100)  # every logit tied: each filter keeps the whole row
    tokens, _, processed = sample(logits, 1.3, top_k, top_p, min_p, _seeds(2))
    assert fake.names() == ["top_k"]
    assert bool((tokens >= 0).all())
    torch.testing.assert_close(processed, torch.full((2,), -math.log(1100.0)))


def test_the_full_vocabulary_path_finds_each_filters_cut(fake: FakeFlashInfer):
    """Near-flat rows whose kept sets run past the shortlist (or top_k above MAX_TOP_K, which
    has none), with a step that each filter's cut must find."""
    generator = torch.Generator().manual_seed(2)
    for vocab, raised, filters in [(1500, 1200, [(0, 0.95, 0.0), (0, 0.95, 0.05)]),
                                   (5000, 4500, [(4400, 1.0, 0.0), (4400, 0.6, 0.0)])]:
        logits = torch.randn(2, vocab, generator=generator) * 0.05
        logits[:, :raised] += 1.0
        for top_k, top_p, min_p in filters:
            tokens, _, processed = sample(logits, 0.7, top_k, top_p, min_p, _seeds(2))
            _matches_reference(logits, tokens, processed, atol=2e-5, temperature=0.7,
                               top_k=top_k, top_p=top_p, min_p=min_p)


def test_each_row_takes_its_own_path_and_keeps_its_token(fake: FakeFlashInfer):
    """Rows that fit their shortlist beside rows that do not: a row's token and
    processed_logp are the same alone as in the mixed batch."""
    logits = _logits(4, 1500, seed=11)
    logits[1::2] = torch.randn(2, 1500, generator=torch.Generator().manual_seed(3)) * 0.01
    seeds = _seeds(4)
    tokens, _, processed = sample(logits, 1.0, 0, 0.9, 0.02, seeds)
    for row in range(4):
        alone, _, alone_processed = sample(logits[row:row + 1], 1.0, 0, 0.9, 0.02,
                                           seeds[row:row + 1])
        assert int(alone) == int(tokens[row])
        assert torch.equal(alone_processed, processed[row:row + 1])
    _matches_reference(logits, tokens, processed, atol=2e-5, top_p=0.9, min_p=0.02)


def test_a_top_k_tie_past_the_shortlist_leaves_top_p_its_whole_mass(fake: FakeFlashInfer):
    """Regression: 2000 logits tie at the k-th value, so the top-k set runs past the 1024 on
    the shortlist. The min-p floor lies above them, but top-p is relative to the whole top-k
    set's mass: measured on the shortlist alone, it would keep token 0 only."""
    row = torch.full((3000,), -10.0)
    row[0], row[1], row[2:2002] = 10.0, 9.5, 7.0
    logits = row.expand(4, -1).contiguous()
    tokens, _, processed = sample(logits, 1.0, 3, 0.015, 0.1, _seeds(4))
    log_q = reference.sample_log_probs(logits[:1], top_k=3, top_p=0.015, min_p=0.1)[0]
    assert log_q[:2].isfinite().all() and not log_q[2:].isfinite().any()
    assert set(tokens.tolist()) <= {0, 1}
    torch.testing.assert_close(processed.double(), log_q[tokens], rtol=0, atol=2e-6)


def test_tied_logits_in_the_shortlist_do_not_move_a_token(fake: FakeFlashInfer):
    """The fake's top-k orders ties by batch size; the kernel sorts them by index."""
    logits = (_logits(6, 3000, seed=8) * 2).round().to(torch.bfloat16)  # many ties
    seeds = _seeds(6)
    tokens, _, _ = sample(logits, 1.0, 40, 1.0, 0.0, seeds)
    assert fake.names() == ["top_k"]
    for row in range(6):
        alone, _, _ = sample(logits[row:row + 1], 1.0, 40, 1.0, 0.0, seeds[row:row + 1])
        assert int(alone) == int(tokens[row])


def test_random_row_seeds_take_one_launch(fake: FakeFlashInfer):
    """Regression (issue 18): a random seed per row took one FlashInfer launch per row."""
    logits = _logits(10, 1500)
    logits[::5] *= 0.01  # a few rows take the full-vocabulary path: no second launch
    sample(logits, 0.9, 0, 0.9, 0.05, _seeds(10))
    assert fake.names() == ["top_k"]


def test_greedy_never_calls_flashinfer(fake: FakeFlashInfer):
    logits = _logits(6, 30)
    tokens, logp, processed = sample(logits, 0.0, 5, 0.5, 0.2, _seeds(6))
    assert fake.calls == []
    assert torch.equal(tokens, logits.argmax(-1))
    assert torch.equal(logp, rlk.logp(logits, tokens, temperature=1.0))
    assert torch.equal(processed, torch.zeros(6))


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_the_smallest_temperature_samples_the_maximum(fake: FakeFlashInfer, top_p: float):
    """logits / 2**-126 overflows float32: the kernels only divide differences from the
    row's maximum (x - max <= 0), so the draw sees weights of 1 (the maxima) and 0."""
    logits = _logits(6, 1500)
    logits[2, 7] = logits[2, 9] = logits[2].max() + 1  # a tie at the top: either may come
    tokens, logp, processed = sample(logits, 2.0**-126, 0, top_p, 0.0, _seeds(6))
    top = logits.argmax(-1)
    assert torch.equal(tokens[[0, 1, 3, 4, 5]], top[[0, 1, 3, 4, 5]])
    assert int(tokens[2]) in (7, 9)
    assert torch.equal(logp, rlk.logp(logits, tokens, temperature=2.0**-126))
    if top_p == 1.0:
        assert torch.equal(processed, logp)
    else:
        assert torch.equal(processed[[0, 1, 3, 4, 5]], torch.zeros(5))
        assert processed[2] == pytest.approx(-math.log(2.0))


# --- temperature applied once -------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
def test_temperature_frequencies_follow_softmax_over_t(fake: FakeFlashInfer, temperature: float):
    logits = torch.tensor([[3.0, 0.6, -1.4, 1.8, -4.0, 0.0, 2.2, -0.8]])  # spread: power
    draws = 1000
    seeds = torch.arange(draws, dtype=torch.int64) + 1000
    tokens, _, _ = sample(logits.expand(draws, -1), temperature, 0, 1.0, 0.0, seeds)
    right = torch.softmax(logits[0].double() / temperature, -1)
    statistic, dof = chi_square(tokens, right)
    assert statistic < chi_square_critical(dof), (temperature, statistic)
    if temperature != 1.0:  # the test has power: T applied twice would be rejected
        twice = torch.softmax(logits[0].double() / temperature**2, -1)
        assert chi_square(tokens, twice)[0] > chi_square_critical(dof)


def test_top_k_frequencies_follow_the_truncated_distribution(fake: FakeFlashInfer):
    logits = torch.tensor([[2.0, 1.2, 0.4, 0.1, -0.3, -1.0, 0.8, 0.5]])
    draws = 800
    seeds = torch.arange(draws, dtype=torch.int64)
    tokens, _, _ = sample(logits.expand(draws, -1), 1.7, 4, 1.0, 0.0, seeds)
    expected = reference.sample_log_probs(logits, temperature=1.7, top_k=4)[0].exp()
    assert set(tokens.tolist()) <= set(expected.nonzero()[:, 0].tolist())
    statistic, dof = chi_square(tokens, expected)
    assert statistic < chi_square_critical(dof)


# --- outputs --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("top_k", "top_p", "min_p"), [(0, 1.0, 0.0), (6, 0.85, 0.05),
                                                       (0, 0.7, 0.0), (0, 1.0, 0.2)])
def test_logp_is_rlk_logp_and_processed_matches_reference(fake: FakeFlashInfer, dtype,
                                                          top_k, top_p, min_p):
    logits = _logits(12, 50, seed=3, dtype=dtype)
    temperature = 0.8
    tokens, logp, processed = sample(logits, temperature, top_k, top_p, min_p, _seeds(12))
    assert tokens.dtype == torch.int64 and logp.dtype == processed.dtype == torch.float32
    assert torch.equal(logp, rlk.logp(logits, tokens, temperature=temperature))
    _matches_reference(logits, tokens, processed, atol=2e-5, temperature=temperature,
                       top_k=top_k, top_p=top_p, min_p=min_p)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_without_filters_processed_logp_is_logp(fake: FakeFlashInfer, dtype):
    logits = _logits(32, 50, seed=4, dtype=dtype)
    tokens, logp, processed = sample(logits, 1.3, 0, 1.0, 0.0, _seeds(32))
    assert bool((tokens >= 0).all())
    assert torch.equal(processed, logp)


def test_ties_at_the_top_p_boundary_are_kept_together(fake: FakeFlashInfer):
    # probs 0.52, 0.19, 0.19, 0.07, 0.03: mass before token 1 is below 0.6, so the nucleus
    # ends at token 1's value and token 2, tied with it, belongs to it as well.
    logits = torch.tensor([[2.0, 1.0, 1.0, 0.0, -1.0]])
    draws = 150
    tokens, _, processed = sample(logits.expand(draws, -1), 1.0, 0, 0.6, 0.0,
                                  torch.arange(draws, dtype=torch.int64))
    assert set(tokens.tolist()) == {0, 1, 2}
    log_q = reference.sample_log_probs(logits, top_p=0.6)[0]
    torch.testing.assert_close(processed.double(), log_q[tokens], rtol=0, atol=2e-6)


def test_rows_without_a_valid_token(fake: FakeFlashInfer):
    logits = _logits(6, 20)
    logits[1] = -math.inf
    logits[3, 7] = math.nan
    logits[4, 2] = math.inf
    seeds = _seeds(6)
    for temperature in (0.0, 1.3):
        for top_p in (0.9, 1.0):
            tokens, logp, processed = sample(logits, temperature, 0, top_p, 0.0, seeds)
            bad = torch.tensor([False, True, False, True, True, False])
            assert tokens[bad].tolist() == [-1, -1, -1]
            assert bool(logp[bad].isnan().all()) and bool(processed[bad].isnan().all())
            assert bool((tokens[~bad] >= 0).all()) and bool(processed[~bad].isfinite().all())
            alone, _, _ = sample(logits[~bad], temperature, 0, top_p, 0.0, seeds[~bad])
            assert torch.equal(tokens[~bad], alone)


def test_partially_masked_rows_are_valid(fake: FakeFlashInfer):
    logits = _logits(4, 12)
    logits[:, 5:] = -math.inf
    for top_p in (1.0, 0.9):
        tokens, logp, processed = sample(logits, 1.0, 0, top_p, 0.0, _seeds(4))
        assert bool((tokens < 5).all()) and bool((tokens >= 0).all())
        assert bool(logp.isfinite().all()) and bool(processed.isfinite().all())


def test_empty_batch(fake: FakeFlashInfer):
    tokens, logp, processed = sample(torch.randn(0, 9), 1.0, 0, 1.0, 0.0,
                                     torch.empty(0, dtype=torch.int64))
    assert tokens.shape == logp.shape == processed.shape == (0,)


# --- per-row seeds --------------------------------------------------------------------------


def test_a_row_depends_only_on_its_logits_and_seed(fake: FakeFlashInfer):
    batch = 40
    logits = _logits(batch, 30, seed=5)
    seeds = torch.cat([_seeds(20), torch.arange(10, dtype=torch.int64) * 64 + 7,  # same slot
                       torch.arange(5, dtype=torch.int64), torch.full((5,), 99)])  # duplicates
    tokens, _, processed = sample(logits, 1.2, 8, 0.95, 0.0, seeds)
    order = torch.randperm(batch, generator=torch.Generator().manual_seed(0))
    shuffled, _, shuffled_processed = sample(logits[order], 1.2, 8, 0.95, 0.0, seeds[order])
    assert torch.equal(shuffled, tokens[order])
    assert torch.equal(shuffled_processed, processed[order])
    for row in (0, 23, 31, 39):
        alone, _, _ = sample(logits[row:row + 1], 1.2, 8, 0.95, 0.0, seeds[row:row + 1])
        assert int(alone) == int(tokens[row])


def test_identical_rows_and_seeds_give_identical_tokens(fake: FakeFlashInfer):
    logits = _logits(1, 64).expand(8, -1)
    tokens, _, _ = sample(logits, 1.0, 0, 1.0, 0.0, torch.full((8,), -12345, dtype=torch.int64))
    assert len(set(tokens.tolist())) == 1
    varied, _, _ = sample(logits, 1.0, 0, 1.0, 0.0, _seeds(8))
    assert len(set(varied.tolist())) > 1


def test_blocks_and_strides_do_not_change_results(fake: FakeFlashInfer, monkeypatch):
    logits = _logits(9, 1100, seed=9)
    logits[::3] *= 0.01  # a third of the rows take the full-vocabulary path
    seeds = _seeds(9)
    reference = sample(logits, 0.9, 0, 0.9, 0.02, seeds)
    monkeypatch.setattr(sampler, "BLOCK_ELEMENTS", 1100 * 7)  # top-k in blocks of 7 rows
    blocked = sample(logits, 0.9, 0, 0.9, 0.02, seeds)
    assert fake.names().count("top_k") == 1 + 2
    strided = sample(logits.t().contiguous().t(), 0.9, 0, 0.9, 0.02, seeds)
    for got in (blocked, strided):
        for left, right in zip(got, reference, strict=True):
            assert torch.equal(left, right)


# --- errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"logits": torch.ones(4, 5, dtype=torch.int32)}, TypeError, "got torch.int32"),
        ({"logits": torch.ones(4)}, ValueError, r"got shape \(4,\)"),
        ({"temperature": -0.1}, ValueError, "got -0.1"),
        ({"temperature": math.nan}, ValueError, "got nan"),
        ({"temperature": "hot"}, TypeError, "got str"),
        ({"top_k": -2}, ValueError, "got -2"),
        ({"top_k": 2.0}, TypeError, "got float"),
        ({"top_p": 0.0}, ValueError, r"\(0, 1\].*got 0.0"),
        ({"min_p": 1.0}, ValueError, r"\[0, 1\).*got 1.0"),
        ({"seeds": torch.zeros(4, dtype=torch.int32)}, TypeError, "got torch.int32"),
        ({"seeds": torch.zeros(3, dtype=torch.int64)}, ValueError, r"\(4,\).*got \(3,\)"),
        ({"seeds": torch.zeros(4, dtype=torch.int64, device="meta")}, ValueError, "got meta"),
    ],
)
def test_bad_arguments_are_refused_with_both_values(fake: FakeFlashInfer, change, error, message):
    arguments: dict[str, Any] = {
        "logits": torch.randn(4, 5), "temperature": 1.0, "top_k": 0, "top_p": 1.0,
        "min_p": 0.0, "seeds": torch.zeros(4, dtype=torch.int64),
    }
    arguments.update(change)
    with pytest.raises(error, match=message):
        sample(**arguments)
    assert fake.calls == []


def test_missing_flashinfer_is_a_clear_import_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "flashinfer", None)
    with pytest.raises(ImportError, match=r"rlk-flashinfer\[flashinfer\]"):
        sample(torch.randn(2, 5), 1.0, 2, 1.0, 0.0, torch.zeros(2, dtype=torch.int64))


def test_unsupported_flashinfer_version_is_refused(fake: FakeFlashInfer, monkeypatch):
    import sys

    monkeypatch.setattr(sys.modules["flashinfer"], "__version__", "0.5.3")
    with pytest.raises(RuntimeError, match=r"0\.5\.3 is outside the supported range 0\.6\.x"):
        sample(torch.randn(2, 5), 1.0, 2, 1.0, 0.0, torch.zeros(2, dtype=torch.int64))
    assert fake.calls == []


def test_a_strict_flashinfer_scope_does_not_bind_the_nested_logp(fake: FakeFlashInfer):
    """Regression (H200 bench): `use_backends("flashinfer", strict=True)` made the nested
    rlk.logp fail, since flashinfer registers no logp kernel."""
    logits = _logits(8, 50, seed=4)
    with rlk.use_backends("flashinfer", strict=True):
        tokens, logp, _ = sample(logits, 0.7, 0, 1.0, 0.0, _seeds(8))
    assert torch.equal(logp, rlk.logp(logits, tokens, temperature=0.7))
