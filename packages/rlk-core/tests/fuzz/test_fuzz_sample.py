"""sample against the float64 distribution, fuzzed: every filter (top_k, top_p, min_p),
greedy and tiny temperatures, NaN, -inf and tied rows, seeds as None, an int or one per row.
Each drawn token must lie in the reference's kept set with the reference's processed
log-probability; `logp` must equal `rlk.logp` bit for bit; with per-row seeds a row's draw
must not depend on the rows beside it. Tiny temperatures (where issue #31 found F3) are a
regime of their own."""

from __future__ import annotations

import pytest
import torch
from fuzzing import FLOATS, fuzz, generator, on_device, snapshot, tally, unchanged
from hypothesis import strategies as st

import rlk
from rlk.ops.sample import reference
from rlk.testing.compare import assert_bitwise_equal

TEMPERATURES = {"usual": [0.0, 0.3, 1.0, 1.7], "tiny": [2.0**-126, 2.0**-100, 1e-30]}


@st.composite
def sample_calls(draw, regime: str):
    gen = generator(draw)
    dtype = draw(st.sampled_from(FLOATS))
    rows = draw(st.sampled_from([0, 1, 4, 9]))
    vocab = draw(st.sampled_from([1, 2, 10, 100, 1000]))
    scale = draw(st.sampled_from([0.1, 2.0, 4.0, 20.0]))
    logits = (torch.randn(rows, vocab, generator=gen) * scale).to(dtype)
    if rows and draw(st.booleans()):
        special = draw(st.sampled_from(["nan", "-inf", "ties"]))
        row = draw(st.integers(0, rows - 1))
        if special == "nan":
            logits[row, 0] = float("nan")
        elif special == "-inf":
            logits[row] = float("-inf")
        else:
            logits[row] = torch.round(logits[row].float()).to(dtype)
    options = {"temperature": draw(st.sampled_from(TEMPERATURES[regime])),
               "top_k": draw(st.sampled_from([0, 1, 5, 50])),
               "top_p": draw(st.sampled_from([1.0, 0.95, 0.5, 0.05])),
               "min_p": draw(st.sampled_from([0.0, 0.05, 0.5]))}
    seed = draw(st.one_of(st.none(), st.integers(-(2**62), 2**62),
                          st.just(torch.randint(-(2**62), 2**62, (rows,), generator=gen))))
    return logits, options, seed


def truths_at_the_edges(logits: torch.Tensor, options: dict) -> list[torch.Tensor]:
    """The float64 processed log-probabilities, then the same with top_p and min_p moved
    each way by float32's rounding of the sums and ratios they are compared with (V * 2^-24):
    a kept set's edge within that may fall either way. (H100 seed 1335521454: top_p 0.5, a
    cumulative mass of 0.49999995 before the 14th token, kept by the float64 reference and
    not by float32: processed_logp -2.325 for -2.357.)"""
    slack = max(1, logits.shape[-1]) * 2.0**-24
    found = [reference.sample_log_probs(logits, **options)]
    for sign in (-1.0, 1.0):
        moved = dict(options)
        if options["top_p"] < 1.0:
            moved["top_p"] = min(1.0 - slack, options["top_p"] + sign * slack)
        if options["min_p"] > 0.0:
            moved["min_p"] = options["min_p"] + sign * slack
        if moved != options:
            found.append(reference.sample_log_probs(logits, **moved))
    return found


@pytest.mark.parametrize("regime", ["usual", "tiny"])
@fuzz(data=st.data())
def test_sample_draws_from_the_reference_distribution(regime, data):
    tally("sample")
    logits, options, seed = data.draw(sample_calls(regime))
    device_logits, device_seed = on_device(logits), on_device(seed)
    before = snapshot(logits=device_logits, seed=device_seed)
    tokens, logp, processed = (t.cpu() for t in rlk.sample(device_logits, seed=device_seed,
                                                           **options))
    unchanged(before, logits=device_logits, seed=device_seed)
    truth, *edges = truths_at_the_edges(logits, options)
    for row in range(logits.shape[0]):
        if bool(truth[row].isnan().all()):
            assert tokens[row] == -1 and logp[row].isnan() and processed[row].isnan()
            continue
        token = int(tokens[row])
        assert 0 <= token < logits.shape[1], f"row {row}: token {token}"
        kept = [float(t[row, token]) for t in (truth, *edges) if t[row, token] > -torch.inf]
        assert kept, f"row {row}: token {token} outside the kept set"
        got = float(processed[row])
        assert any(abs(got - want) <= 2e-5 + 1e-5 * abs(want) for want in kept), \
            f"row {row}: processed_logp {got}, expected {float(truth[row, token])}"
    valid = tokens >= 0  # logp is rlk.logp's on the same device, bit for bit
    expected = rlk.logp(device_logits, on_device(torch.where(valid, tokens, 0)),
                        temperature=options["temperature"] or 1.0).cpu()
    assert_bitwise_equal("logp", logp[valid], expected[valid])
    if isinstance(seed, torch.Tensor) and logits.shape[0] > 1:  # rows alone, their own seeds
        part = torch.randperm(logits.shape[0], generator=generator(data.draw))[:2]
        alone = rlk.sample(on_device(logits[part]), seed=on_device(seed[part]), **options)
        for name, whole, single in zip(("tokens", "logp", "processed_logp"),
                                       (tokens, logp, processed), alone, strict=True):
            assert_bitwise_equal(f"{name} of rows {part.tolist()} alone", single.cpu(),
                                 whole[part])
