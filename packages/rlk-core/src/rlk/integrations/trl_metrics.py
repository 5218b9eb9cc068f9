"""TRL's logged metrics from a patched GRPOTrainer step, computed as TRL computes them
(its reductions over processes, its definitions of the ratio statistics)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor


def global_mean(trainer: Any, total: Tensor, count: Tensor) -> float:
    """A mean over every process: the sums of `total` and `count` (TRL's reduction)."""
    totals = trainer.accelerator.reduce(torch.stack([total.float(), count.float()]),
                                        reduction="sum")
    return float(totals[0] / totals[1].clamp(min=1.0))


def maskedglobal_mean(trainer: Any, values: Tensor, mask: Tensor) -> float:
    """TRL's mean of a [B, T] statistic over the loss mask, or of a [B, 1] one over
    every sequence (empty ones too)."""
    if values.shape[1] == 1:
        return global_mean(trainer, values.sum(), values.new_tensor(float(values.shape[0])))
    return global_mean(trainer, (values * mask).sum(), mask.sum())


def log_metrics(trainer: Any, mode: str, metrics: Mapping[str, Tensor], entropy_mean: Tensor,
                 mask: Tensor, aux_loss: Tensor | None) -> None:
    """TRL's `kl`, `entropy` and `aux_loss` from rlk's metrics, reduced over processes as
    TRL reduces them."""
    tokens = mask.sum()
    logged = trainer._metrics[mode]
    if trainer.beta != 0.0:
        logged["kl"].append(global_mean(trainer, metrics["mean_kl"] * tokens, tokens))
    logged["entropy"].append(global_mean(trainer, entropy_mean.detach() * tokens, tokens))
    if aux_loss is not None:
        logged["aux_loss"].append(
            trainer.accelerator.gather_for_metrics(aux_loss).mean().item())


def log_ratio_metrics(trainer: Any, mode: str, inputs: Mapping[str, Any], logps: Tensor,
                       old_logps: Tensor, mask: Tensor) -> None:
    """TRL's statistics of the importance ratio (`clip_ratio/*`, `cispo_clip_ratio`,
    `vespo/phi_seq_mean`), defined as TRL defines them, from the step's detached log-probs.

    A sequence-level ratio is one value a sequence: TRL averages those over every
    sequence, empty ones (ratio 1, never clipped) included.
    """
    from trl.trainer.utils import nanmax, nanmin

    logged = trainer._metrics[mode]
    advantages = inputs["advantages"]
    advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    log_ratio = logps - old_logps
    if trainer.loss_type == "vespo":
        phi = trainer.get_gamma_weights(
            advantages=advantages, log_ratio_per_token=log_ratio, mask=mask,
            importance_sampling_ratio=inputs.get("importance_sampling_ratio"),
            k_pos=trainer.args.vespo_k_pos, lambda_pos=trainer.args.vespo_lambda_pos,
            k_neg=trainer.args.vespo_k_neg, lambda_neg=trainer.args.vespo_lambda_neg)
        logged["vespo/phi_seq_mean"].append(maskedglobal_mean(trainer, phi, mask))
        return
    if trainer.importance_sampling_level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    ratio = torch.exp(log_ratio)
    if trainer.loss_type == "cispo":
        clipped = (ratio > trainer.epsilon_high) & (advantages > 0)
        logged["cispo_clip_ratio"].append(maskedglobal_mean(trainer, clipped.float(), mask))
        return
    if trainer.loss_type == "sapo":
        return
    if trainer.args.delta is not None:
        ratio = ratio.clamp(max=trainer.args.delta)
    low = (ratio < 1 - trainer.epsilon_low) & (advantages < 0)
    high = (ratio > 1 + trainer.epsilon_high) & (advantages > 0)
    for name, clipped in (("low_mean", low), ("high_mean", high), ("region_mean", low | high)):
        logged[f"clip_ratio/{name}"].append(
            maskedglobal_mean(trainer, clipped.float(), mask))

    def per_sequence(values: Tensor) -> Tensor:  # NaN for an empty row, as in TRL
        values = values.float()
        if values.shape[1] == 1:
            return values.squeeze(1)
        return (values * mask).sum(-1) / mask.sum(-1)

    logged["clip_ratio/low_min"].append(
        nanmin(trainer.accelerator.gather(per_sequence(low))).item())
    logged["clip_ratio/high_max"].append(
        nanmax(trainer.accelerator.gather(per_sequence(high))).item())
