"""Train-inference log-prob parity: how far vLLM's rollout log-probs are from the trainer's.

The gap is what truncated importance sampling (`rlk.policy_loss(tis_cap=...)`)
corrects; measuring it says whether the correction is needed and how large.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlk_vllm.batch import RolloutBatch

DEFAULT_THRESHOLDS = (1e-4, 1e-3, 1e-2, 1e-1)
LAYOUTS = ("sequence", "completion")


@dataclass(frozen=True)
class ParityReport:
    """Per-token differences `trainer_logp - rollout_logp` over the completion mask.

    `diff` is [B, T] float32 (0 on padding); `frac_above[t]` is the fraction of
    real tokens whose absolute difference exceeds `t`.
    """

    num_tokens: int
    max_abs: float
    mean_abs: float
    mean: float
    frac_above: dict[float, float]
    worst: tuple[int, int]
    diff: torch.Tensor
    trainer_logp: torch.Tensor

    def as_dict(self) -> dict[str, float | int]:
        """Flat numbers for a metrics logger."""
        out: dict[str, float | int] = {
            "num_tokens": self.num_tokens,
            "max_abs": self.max_abs,
            "mean_abs": self.mean_abs,
            "mean": self.mean,
        }
        out.update({f"frac_above_{t:g}": f for t, f in self.frac_above.items()})
        return out

    def __str__(self) -> str:
        above = ", ".join(f"|d|>{t:g}: {f:.2%}" for t, f in self.frac_above.items())
        return (f"logp parity over {self.num_tokens} tokens: max |d| {self.max_abs:.3e} "
                f"at (row, step) {self.worst}, mean |d| {self.mean_abs:.3e}, "
                f"mean d {self.mean:+.3e}; {above}")


def _check_leading(name: str, tensor: torch.Tensor, batch: RolloutBatch, layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {list(LAYOUTS)}, got {layout!r}")
    rows = batch.batch_size
    steps = (
        int(batch.completion_ids.shape[1])
        if layout == "completion"
        else int((batch.prompt_lengths + batch.completion_lengths).max())
    )
    if tensor.dim() != 3 or tensor.shape[0] != rows or tensor.shape[1] < steps:
        raise ValueError(
            f"{name} must be [B={rows}, L>={steps}, *] for layout={layout!r}, "
            f"got shape {tuple(tensor.shape)}"
        )


def _positions(batch: RolloutBatch, layout: str) -> torch.Tensor:
    """[B, T] index into dim 1 of the trainer's tensor for each completion token."""
    if layout == "completion":
        return torch.arange(batch.completion_ids.shape[1]).expand_as(batch.completion_ids)
    return batch.completion_positions()


def _trainer_logp(
    batch: RolloutBatch,
    logits: torch.Tensor | None,
    hidden: torch.Tensor | None,
    lm_head: torch.Tensor | None,
    bias: torch.Tensor | None,
    temperature: float,
    layout: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """rlk's log-probs of the real completion tokens, and their flat [B*T] indices."""
    import rlk

    mask = batch.completion_mask.bool().reshape(-1)
    real = mask.nonzero().squeeze(1)
    source = logits if logits is not None else hidden
    assert source is not None
    device = source.device
    positions = _positions(batch, layout).reshape(-1)[real].to(device)
    rows = (real // batch.completion_ids.shape[1]).to(device)
    tokens = batch.completion_ids.reshape(-1)[real].to(device)
    flat = rows * source.shape[1] + positions
    with torch.no_grad():
        if logits is not None:
            # rows= computes only the completion rows: no [B*T, V] copy of the logits.
            all_tokens = torch.zeros(source.shape[0] * source.shape[1], dtype=torch.int64,
                                     device=device)
            all_tokens[flat] = tokens
            logp = rlk.logp(source.reshape(-1, source.shape[-1]), all_tokens,
                            temperature=temperature, rows=flat)
        else:
            assert lm_head is not None  # checked by logprob_parity
            picked = source.reshape(-1, source.shape[-1])[flat]
            logp = rlk.linear_logp(picked, lm_head, tokens, bias=bias, temperature=temperature)
    return logp.float().cpu(), real


def logprob_parity(
    batch: RolloutBatch,
    *,
    logits: torch.Tensor | None = None,
    hidden: torch.Tensor | None = None,
    lm_head: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    temperature: float | None = None,
    layout: str = "sequence",
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
) -> ParityReport:
    """Compare `batch.rollout_logp` with rlk's log-probs from the trainer's own forward.

    Give either `logits` [B, L, V] or `hidden` [B, L, H] with `lm_head` [V, H] (and
    optional `bias`). With layout="sequence" (default) dim 1 follows
    `batch.sequences()`, where position p predicts token p + 1; with
    layout="completion" dim 1 is already aligned with the completion tokens.
    `temperature` defaults to the one the rollout log-probs were computed at.
    """
    if (logits is None) == (hidden is None):
        raise ValueError("give exactly one of logits= or hidden= (with lm_head=)")
    if hidden is not None and lm_head is None:
        raise ValueError("hidden= needs lm_head= (the [V, H] output projection)")
    if logits is not None:
        _check_leading("logits", logits, batch, layout)
    if hidden is not None:
        _check_leading("hidden", hidden, batch, layout)
    if not thresholds or any(t <= 0 for t in thresholds):
        raise ValueError(f"thresholds must be positive numbers, got {list(thresholds)}")
    temp = batch.logp_temperature if temperature is None else float(temperature)
    if not temp > 0:
        raise ValueError(f"temperature must be > 0, got {temp}")
    trainer, real = _trainer_logp(batch, logits, hidden, lm_head, bias, temp, layout)
    rollout = batch.rollout_logp.reshape(-1)[real].float()
    delta = trainer - rollout
    diff = torch.zeros(batch.completion_ids.numel(), dtype=torch.float32)
    diff[real] = delta
    full_trainer = torch.zeros_like(diff)
    full_trainer[real] = trainer
    count = int(real.numel())
    if count == 0:
        raise ValueError("the batch has no completion tokens to compare")
    absd = delta.abs()
    worst_flat = int(real[int(absd.argmax())])
    width = batch.completion_ids.shape[1]
    return ParityReport(
        num_tokens=count,
        max_abs=float(absd.max()),
        mean_abs=float(absd.mean()),
        mean=float(delta.mean()),
        frac_above={float(t): int((absd > t).sum()) / count for t in thresholds},
        worst=(worst_flat // width, worst_flat % width),
        diff=diff.reshape(batch.completion_ids.shape),
        trainer_logp=full_trainer.reshape(batch.completion_ids.shape),
    )
