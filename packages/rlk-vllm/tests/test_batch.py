"""RolloutBatch helpers: sequences for the trainer's forward, and where completions sit in them."""

from __future__ import annotations

import pytest
import torch

from rlk_vllm.batch import Candidate, build_rollout_batch


def candidates() -> list[Candidate]:
    return [
        Candidate(0, [1, 4, 5], [7, 8], [-0.5, -1.5], "length"),
        Candidate(0, [1, 4, 5], [9], [-0.25], "stop"),
        Candidate(1, [1, 6], [2, 3, 11], [-1.0, -2.0, -3.0], "length"),
        Candidate(1, [1, 6], [], [], "stop"),
    ]


def test_padding_and_masks() -> None:
    batch = build_rollout_batch(candidates(), group_size=2, pad_token_id=99,
                                logp_temperature=0.8, logprobs_mode="processed_logprobs")
    assert batch.completion_ids.tolist() == [[7, 8, 99], [9, 99, 99], [2, 3, 11], [99, 99, 99]]
    assert batch.prompt_ids.tolist() == [[1, 4, 5], [1, 4, 5], [1, 6, 99], [1, 6, 99]]
    assert batch.completion_mask.tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]]
    assert batch.rollout_logp.tolist() == [[-0.5, -1.5, 0], [-0.25, 0, 0], [-1, -2, -3], [0, 0, 0]]
    assert batch.group_ids.tolist() == [0, 0, 1, 1]
    assert batch.finish_reasons == ("length", "stop", "length", "stop")
    assert batch.cached_prompt_tokens.tolist() == [-1] * 4


def test_sequences_and_completion_positions() -> None:
    batch = build_rollout_batch(candidates(), group_size=2, pad_token_id=0,
                                logp_temperature=1.0, logprobs_mode="processed_logprobs")
    tokens, mask = batch.sequences()
    assert tokens.tolist() == [[1, 4, 5, 7, 8], [1, 4, 5, 9, 0], [1, 6, 2, 3, 11],
                               [1, 6, 0, 0, 0]]
    assert mask.tolist() == [[1] * 5, [1, 1, 1, 1, 0], [1] * 5, [1, 1, 0, 0, 0]]
    positions = batch.completion_positions()
    # The logits at position p predict token p + 1; padding points at the last real position.
    assert positions.tolist() == [[2, 3, 4], [2, 3, 3], [1, 2, 3], [1, 1, 1]]
    real = batch.completion_mask.bool()
    rows = torch.arange(4)[:, None].expand_as(positions)
    assert torch.equal(tokens[rows[real], positions[real] + 1], batch.completion_ids[real])


def test_to_moves_every_tensor() -> None:
    batch = build_rollout_batch(candidates(), group_size=2, pad_token_id=0,
                                logp_temperature=1.0, logprobs_mode="processed_logprobs")
    moved = batch.to("meta")
    assert moved.completion_ids.device.type == "meta" and moved.group_ids.device.type == "meta"
    assert moved.finish_reasons == batch.finish_reasons


@pytest.mark.parametrize(
    ("cands", "group", "message"),
    [
        ([], 2, "zero candidates"),
        (candidates()[:3], 2, "not a multiple of the group size 2"),
        ([candidates()[2], candidates()[3], candidates()[0], candidates()[1]], 2, "prompt-major"),
        ([Candidate(0, [1], [4, 5], [-1.0], "length")], 1, "2 completion tokens but 1"),
        ([Candidate(0, [], [4], [-1.0], "length")], 1, "empty prompt"),
    ],
)
def test_build_errors(cands: list[Candidate], group: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_rollout_batch(cands, group_size=group, pad_token_id=0, logp_temperature=1.0,
                            logprobs_mode="processed_logprobs")
