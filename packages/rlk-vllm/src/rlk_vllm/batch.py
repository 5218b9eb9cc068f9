"""RolloutBatch: what a rollout step hands to the trainer, as padded tensors.

Rows are candidates, prompt-major: rows `g*G .. g*G+G-1` are the G candidates of
prompt `g`, and `group_ids[row] == g`, which is what `rlk.group_advantages` groups by.
Completion-side tensors are `[B, T]` with `T` the longest completion, so that
`rollout_logp` and `completion_mask` go straight into `rlk.policy_loss`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class Candidate:
    """One sampled completion as the engine returned it, before padding."""

    group: int
    prompt_ids: Sequence[int]
    completion_ids: Sequence[int]
    logp: Sequence[float]
    finish_reason: str
    text: str | None = None
    cached_prompt_tokens: int = -1


@dataclass(frozen=True)
class RolloutBatch:
    """Padded rollouts of `num_groups` prompts times `group_size` candidates each.

    prompt_ids [B, P] int64, right-padded with `pad_token_id`; prompt_lengths [B] int64.
    completion_ids [B, T] int64, right-padded; completion_lengths [B] int64.
    completion_mask [B, T] float32: 1 on real completion tokens, 0 on padding.
    rollout_logp [B, T] float32: vLLM's log-prob of each sampled token (0 on padding),
        under `logp_temperature` (see `logprobs_mode`).
    group_ids [B] int64; finish_reasons: "stop", "length" or "abort" per row.
    cached_prompt_tokens [B] int64: prompt tokens vLLM served from its prefix cache
        (-1 where the engine did not say).
    """

    prompt_ids: torch.Tensor
    prompt_lengths: torch.Tensor
    completion_ids: torch.Tensor
    completion_lengths: torch.Tensor
    completion_mask: torch.Tensor
    rollout_logp: torch.Tensor
    group_ids: torch.Tensor
    finish_reasons: tuple[str, ...]
    group_size: int
    pad_token_id: int
    logp_temperature: float
    logprobs_mode: str
    cached_prompt_tokens: torch.Tensor
    completion_texts: tuple[str, ...] | None = None

    @property
    def batch_size(self) -> int:
        return int(self.completion_ids.shape[0])

    @property
    def num_groups(self) -> int:
        return self.batch_size // self.group_size

    def sequences(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's prompt followed by its completion, right-padded: (tokens [B, L], mask [B, L]).

        The trainer runs its model on these; `completion_positions()` says which
        positions' logits predict the completion tokens.
        """
        width = int((self.prompt_lengths + self.completion_lengths).max().item())
        tokens = torch.full((self.batch_size, width), self.pad_token_id, dtype=torch.int64)
        mask = torch.zeros((self.batch_size, width), dtype=torch.int64)
        for row in range(self.batch_size):
            p = int(self.prompt_lengths[row])
            c = int(self.completion_lengths[row])
            tokens[row, :p] = self.prompt_ids[row, :p]
            tokens[row, p : p + c] = self.completion_ids[row, :c]
            mask[row, : p + c] = 1
        return tokens, mask

    def completion_positions(self) -> torch.Tensor:
        """[B, T] int64: position in `sequences()` whose logits predict completion token t.

        That is `prompt_length - 1 + t`; padding entries point at the row's last
        real position so that gathering with them stays in bounds.
        """
        steps = torch.arange(self.completion_ids.shape[1], dtype=torch.int64)
        positions = self.prompt_lengths[:, None] - 1 + steps[None, :]
        last = (self.prompt_lengths + self.completion_lengths - 1).clamp(min=0)[:, None]
        return torch.minimum(positions, last)

    def to(self, device: torch.device | str) -> RolloutBatch:
        """The same batch with every tensor on `device`."""
        moved = {
            name: getattr(self, name).to(device)
            for name in (
                "prompt_ids", "prompt_lengths", "completion_ids", "completion_lengths",
                "completion_mask", "rollout_logp", "group_ids", "cached_prompt_tokens",
            )
        }
        return replace(self, **moved)


def build_rollout_batch(
    candidates: Sequence[Candidate],
    *,
    group_size: int,
    pad_token_id: int,
    logp_temperature: float,
    logprobs_mode: str,
) -> RolloutBatch:
    """Pad engine outputs (already in prompt-major order) into a RolloutBatch."""
    if not candidates:
        raise ValueError("cannot build a RolloutBatch from zero candidates")
    if len(candidates) % group_size:
        raise ValueError(f"got {len(candidates)} candidates, not a multiple of the group "
                         f"size {group_size}")
    for row, cand in enumerate(candidates):
        if cand.group != row // group_size:
            raise ValueError(f"candidate {row} belongs to group {cand.group}, expected "
                             f"{row // group_size} (rows must be prompt-major)")
        if len(cand.logp) != len(cand.completion_ids):
            raise ValueError(f"candidate {row}: {len(cand.completion_ids)} completion tokens "
                             f"but {len(cand.logp)} log-probs")
        if not cand.prompt_ids:
            raise ValueError(f"candidate {row} has an empty prompt")
    batch = len(candidates)
    prompt_width = max(len(c.prompt_ids) for c in candidates)
    width = max(1, max(len(c.completion_ids) for c in candidates))
    prompt_ids = torch.full((batch, prompt_width), pad_token_id, dtype=torch.int64)
    completion_ids = torch.full((batch, width), pad_token_id, dtype=torch.int64)
    rollout_logp = torch.zeros((batch, width), dtype=torch.float32)
    for row, cand in enumerate(candidates):
        prompt_ids[row, : len(cand.prompt_ids)] = torch.as_tensor(cand.prompt_ids)
        n = len(cand.completion_ids)
        if n:
            completion_ids[row, :n] = torch.as_tensor(cand.completion_ids, dtype=torch.int64)
            rollout_logp[row, :n] = torch.as_tensor(cand.logp, dtype=torch.float32)
    completion_lengths = torch.tensor([len(c.completion_ids) for c in candidates])
    mask = (torch.arange(width)[None, :] < completion_lengths[:, None]).to(torch.float32)
    texts = [c.text for c in candidates]
    return RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_lengths=torch.tensor([len(c.prompt_ids) for c in candidates]),
        completion_ids=completion_ids,
        completion_lengths=completion_lengths,
        completion_mask=mask,
        rollout_logp=rollout_logp,
        group_ids=torch.tensor([c.group for c in candidates], dtype=torch.int64),
        finish_reasons=tuple(c.finish_reason for c in candidates),
        group_size=group_size,
        pad_token_id=pad_token_id,
        logp_temperature=logp_temperature,
        logprobs_mode=logprobs_mode,
        cached_prompt_tokens=torch.tensor([c.cached_prompt_tokens for c in candidates]),
        completion_texts=None if any(t is None for t in texts) else tuple(str(t) for t in texts),
    )
