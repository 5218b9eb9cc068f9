"""logprob_parity: per-token differences between rollout log-probs and rlk's, on the fake engine.

The fake engine is a bigram model, so the trainer's logits for `batch.sequences()` are
`table[tokens]`, and the expected differences have a float64 closed form.
"""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB, make_executor

from rlk_vllm import RolloutBatch, logprob_parity

PROMPTS = [{"prompt_token_ids": [1, 5, 9]}, {"prompt_token_ids": [1, 7, 7, 7, 3]}]


def rollout(table: torch.Tensor, temperature: float = 0.7) -> RolloutBatch:
    executor, _ = make_executor(
        table, num_generations=4,
        sampling_params={"temperature": temperature, "max_tokens": 7, "seed": 2},
    )
    return executor.generate(PROMPTS)


def reference_diff(batch: RolloutBatch, table: torch.Tensor, temperature: float) -> torch.Tensor:
    """float64 trainer log-prob minus the rollout's, token by token (0 on padding)."""
    tokens, _ = batch.sequences()
    out = torch.zeros(batch.completion_ids.shape, dtype=torch.float64)
    for row in range(batch.batch_size):
        p = int(batch.prompt_lengths[row])
        for t in range(int(batch.completion_lengths[row])):
            prev, tok = int(tokens[row, p - 1 + t]), int(tokens[row, p + t])
            logp = (table[prev].double() / temperature).log_softmax(-1)[tok]
            out[row, t] = logp - float(batch.rollout_logp[row, t])
    return out


def test_same_model_gives_near_zero_differences(table: torch.Tensor) -> None:
    batch = rollout(table)
    tokens, _ = batch.sequences()
    report = logprob_parity(batch, logits=table[tokens])
    assert report.num_tokens == int(batch.completion_mask.sum())
    assert report.max_abs < 1e-5
    assert report.frac_above[1e-4] == 0.0
    real = batch.completion_mask.bool()
    assert torch.allclose(report.trainer_logp[real], batch.rollout_logp[real], atol=1e-5)
    assert (report.diff[~real] == 0).all()


def test_a_different_model_reports_the_exact_gaps(table: torch.Tensor) -> None:
    batch = rollout(table)
    trainer_table = table + 0.3 * torch.randn(VOCAB, VOCAB, generator=torch.Generator()
                                              .manual_seed(4))
    tokens, _ = batch.sequences()
    report = logprob_parity(batch, logits=trainer_table[tokens], thresholds=(0.01, 0.1, 1.0))
    expected = reference_diff(batch, trainer_table, 0.7)
    real = batch.completion_mask.bool()
    assert torch.allclose(report.diff.double(), expected, atol=2e-5)
    gaps = expected[real].abs()
    assert report.max_abs == pytest.approx(float(gaps.max()), abs=2e-5)
    assert report.mean_abs == pytest.approx(float(gaps.mean()), abs=2e-5)
    assert report.mean == pytest.approx(float(expected[real].mean()), abs=2e-5)
    for threshold, fraction in report.frac_above.items():
        assert fraction == pytest.approx(float((gaps > threshold).double().mean()), abs=1e-9)
    assert report.frac_above[1.0] < report.frac_above[0.01], "thresholds did not separate"
    row, step = report.worst
    assert abs(float(expected[row, step])) == pytest.approx(float(gaps.max()), abs=2e-5)
    assert set(report.as_dict()) >= {"max_abs", "mean_abs", "mean", "frac_above_0.1"}
    assert f"over {report.num_tokens} tokens" in str(report)


def test_completion_layout_and_explicit_temperature(table: torch.Tensor) -> None:
    batch = rollout(table, temperature=1.3)
    tokens, _ = batch.sequences()
    aligned = table[tokens.gather(1, batch.completion_positions())]
    report = logprob_parity(batch, logits=aligned, layout="completion")
    assert report.max_abs < 1e-5
    hotter = logprob_parity(batch, logits=aligned, layout="completion", temperature=2.0)
    expected = reference_diff(batch, table, 2.0)
    assert torch.allclose(hotter.diff.double(), expected, atol=2e-5)


def test_hidden_states_and_lm_head(table: torch.Tensor) -> None:
    batch = rollout(table)
    tokens, _ = batch.sequences()
    # A one-hot "hidden state" times lm_head = table.T picks row `token` of the table.
    hidden = torch.nn.functional.one_hot(tokens, VOCAB).float()
    report = logprob_parity(batch, hidden=hidden, lm_head=table.T.contiguous())
    assert report.max_abs < 1e-5
    bias = torch.linspace(-1, 1, VOCAB)
    shifted = logprob_parity(batch, hidden=hidden, lm_head=table.T.contiguous(), bias=bias)
    expected = reference_diff(batch, table + bias[None, :], 0.7)
    assert torch.allclose(shifted.diff.double(), expected, atol=2e-5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of logits= or hidden="),
        ({"hidden": torch.zeros(8, 12, 4)}, "needs lm_head="),
        ({"logits": torch.zeros(8, 2, VOCAB)}, r"logits must be \[B=8, L>="),
        ({"logits": torch.zeros(7, 40, VOCAB)}, r"got shape \(7, 40, 40\)"),
        ({"logits": torch.zeros(8, 40, VOCAB), "layout": "rows"}, "layout must be one of"),
        ({"logits": torch.zeros(8, 40, VOCAB), "thresholds": (0.1, 0)}, "positive"),
        ({"logits": torch.zeros(8, 40, VOCAB), "temperature": 0.0}, "temperature must be > 0"),
    ],
)
def test_errors(table: torch.Tensor, kwargs: dict[str, object], message: str) -> None:
    batch = rollout(table)
    with pytest.raises(ValueError, match=message):
        logprob_parity(batch, **kwargs)  # type: ignore[arg-type]
