"""A RolloutBatch goes straight into rlk's trainer ops: group_advantages and policy_loss."""

from __future__ import annotations

import torch
from conftest import VOCAB, make_executor

import rlk

PROMPTS = [{"prompt_token_ids": [1, 4, 9]}, {"prompt_token_ids": [1, 6]},
           {"prompt_token_ids": [1, 2, 3, 5, 8]}]


def test_batch_feeds_group_advantages_and_policy_loss(table: torch.Tensor) -> None:
    executor, _ = make_executor(table, num_generations=4,
                                sampling_params={"temperature": 0.9, "max_tokens": 6, "seed": 4})
    batch = executor.generate(PROMPTS)
    rewards = (batch.completion_ids % 3 == 0).float().sum(1) / batch.completion_lengths
    by_size = rlk.group_advantages(rewards, group_size=batch.group_size)
    by_ids = rlk.group_advantages(rewards, group_ids=batch.group_ids)
    assert torch.equal(by_size, by_ids)
    grouped = rewards.view(batch.num_groups, batch.group_size).double()
    expected = (grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)
    assert torch.allclose(by_size.double(), expected.reshape(-1), atol=1e-5)

    # The trainer's policy drifted from the engine's: importance weights move off 1.
    trainer_table = table + 0.5 * torch.randn(VOCAB, VOCAB,
                                              generator=torch.Generator().manual_seed(8))
    tokens, _ = batch.sequences()
    logits = trainer_table[tokens.gather(1, batch.completion_positions())]
    targets = batch.completion_ids.masked_fill(batch.completion_mask == 0, -100)
    logits.requires_grad_(True)
    logp = rlk.logp(logits, targets, temperature=batch.logp_temperature)
    loss, metrics = rlk.policy_loss(logp, logp.detach(), by_size, batch.completion_mask,
                                    rollout_logp=batch.rollout_logp, tis_cap=1.2)
    real = batch.completion_mask.bool()
    weight = (logp.detach() - batch.rollout_logp).exp()[real]
    assert abs(float(metrics["truncated_fraction"]) - float((weight > 1.2).double().mean())) < 1e-6
    assert 0 < float(metrics["truncated_fraction"]) < 1
    loss.backward()
    assert logits.grad is not None
    assert (logits.grad[~real] == 0).all() and logits.grad[real].abs().sum() > 0
