"""rlk inside TRL: `patch()` routes GRPOTrainer's log-probs and loss to rlk.

    from rlk.integrations import trl as rlk_trl
    rlk_trl.patch()          # or: with rlk_trl.patched(): trainer.train()

What is routed (docs/integrations/trl.md has the option table):
- `trl.trainer.utils.selective_log_softmax` -> `rlk.logp`, in the logits' dtype;
- `trl.trainer.utils.entropy_from_logits` -> `rlk.logp_entropy`'s entropy;
- the fused LM head's chunked log-prob function (`ChunkedLogProbFunction`, which
  GRPOTrainer's `_get_per_token_logps_and_entropies` runs) -> `rlk.linear_logp` /
  `rlk.linear_logp_entropy`;
- `GRPOTrainer._compute_loss` -> one `rlk.policy_loss` call configured from the
  trainer's `GRPOConfig` by `loss_config`, which raises `UnsupportedOptionError`
  for a setting rlk cannot express.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

import rlk
from rlk.integrations._patching import Adapter, Patches, UnsupportedOptionError

SUPPORTED = ((1, 16), (1, 17))  # trl >=1.16,<1.17
TESTED = "trl 1.16.0 with transformers 5.24.0"
IGNORE_INDEX = -100

# the per-token outputs TRL's fused LM head may ask for, and those rlk computes
LM_HEAD_OUTPUTS = ("log_probs", "entropy")
# inputs GRPOTrainer forwards from the batch to the model (multimodal and token-type fields)
_MODEL_INPUTS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask",
                 "spatial_shapes", "num_tiles", "image_sizes", "token_type_ids",
                 "mm_token_type_ids", "image_position_ids")


# ---------------------------------------------------------------------------
# log-probabilities


def selective_log_softmax(logits: Tensor, index: Tensor, temperature: float = 1.0,
                          row_mask: Tensor | None = None) -> Tensor:
    """log-softmax(logits / temperature) at `index`, in the logits' dtype (TRL's contract).

    `row_mask` zeros skip a position: its log-prob is 0 and it gets no gradient.
    """
    if index.dim() == logits.dim():
        raise UnsupportedOptionError(
            f"selective_log_softmax with an index of shape {tuple(index.shape)} (K="
            f"{index.shape[-1]} gathers per position): rlk.logp takes one token per position")
    tokens = index if row_mask is None else index.masked_fill(row_mask == 0, IGNORE_INDEX)
    return rlk.logp(logits, tokens, temperature=temperature).to(logits.dtype)


def entropy_from_logits(logits: Tensor, chunk_size: int = 128) -> Tensor:
    """Entropy of softmax(logits) per row, in the logits' dtype.

    `chunk_size` is accepted for TRL's signature; rlk bounds memory itself.
    """
    tokens = torch.zeros(logits.shape[:-1], dtype=torch.int64, device=logits.device)
    return rlk.logp_entropy(logits, tokens)[1].to(logits.dtype)


class LinearLogProbs:
    """TRL's `ChunkedLogProbFunction.apply` contract, served by rlk.linear_logp(_entropy).

    Returns (log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1) as TRL does;
    rlk computes the first two, so asking for the others raises. The logit scale, soft
    cap and temperature apply in TRL's order; under torch.autocast the GEMM runs in the
    autocast dtype as in TRL, but rlk keeps its logits in float32 where TRL rounds them
    to that dtype. `chunk_size` is TRL's tiling knob; rlk picks its own chunks.
    """

    @staticmethod
    def apply(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
              temperature: float, chunk_size: int, final_logit_softcapping: float | None = None,
              logit_scale: float = 1.0, outputs: tuple[str, ...] = LM_HEAD_OUTPUTS,
              ) -> tuple[Tensor | None, ...]:
        unknown = sorted(set(outputs) - set(LM_HEAD_OUTPUTS))
        if unknown:
            raise UnsupportedOptionError(
                f"the fused LM head was asked for {unknown}; rlk computes {list(LM_HEAD_OUTPUTS)}")
        options: dict[str, Any] = dict(bias=bias, temperature=temperature,
                                       softcap=final_logit_softcapping,
                                       logit_scale=logit_scale)
        if "entropy" in outputs:
            logp, entropy = rlk.linear_logp_entropy(hidden, weight, targets, **options)
            return logp, entropy, None, None, None
        return rlk.linear_logp(hidden, weight, targets, **options), None, None, None, None


# ---------------------------------------------------------------------------
# the loss


@dataclass(frozen=True)
class LossConfig:
    """A GRPOConfig's loss translated: `policy_loss` are the keyword arguments of
    rlk.policy_loss; `scale_by_accumulation` divides the loss by the gradient
    accumulation steps in training (TRL's normaliser for these loss types)."""

    policy_loss: Mapping[str, Any] = field(default_factory=dict)
    scale_by_accumulation: bool = True


# TRL loss_type -> rlk aggregation, for the loss types whose normaliser rlk has
_AGGREGATION = {"bnpo": "token-mean", "grpo": "seq-mean-token-mean",
                "luspo": "seq-mean-token-sum"}
# loss types that average over every row, empty ones included (rlk skips empty rows)
_MEAN_OVER_ALL_ROWS = ("grpo", "luspo")


def loss_config(args: Any) -> LossConfig:
    """rlk's configuration for a GRPOConfig's loss, or UnsupportedOptionError naming the option."""
    loss_type = args.loss_type
    if loss_type not in _AGGREGATION:
        raise UnsupportedOptionError(
            f"loss_type={loss_type!r}: rlk.policy_loss cannot express it yet (supported: "
            f"{', '.join(map(repr, _AGGREGATION))})")
    if loss_type in _MEAN_OVER_ALL_ROWS and _rows_can_be_empty(args):
        raise UnsupportedOptionError(
            f"loss_type={loss_type!r} with masked completions: TRL averages over every "
            "completion, empty ones included; rlk.policy_loss averages non-empty ones")
    if args.beta != 0.0 and args.use_bias_correction_kl:
        raise UnsupportedOptionError(
            f"beta={args.beta} with use_bias_correction_kl=True: rlk.policy_loss has no KL "
            "bias correction; set use_bias_correction_kl=False")
    if args.use_vllm:
        raise UnsupportedOptionError(
            "use_vllm=True: the adapter is not tested with vLLM's importance-sampling "
            "correction")
    if args.entropy_coef != 0.0 or args.use_adaptive_entropy:
        raise UnsupportedOptionError(
            f"entropy_coef={args.entropy_coef}, use_adaptive_entropy="
            f"{args.use_adaptive_entropy}: the entropy bonus is not translated yet")
    if args.off_policy_mask_threshold is not None or args.top_entropy_quantile < 1.0:
        raise UnsupportedOptionError(
            "off_policy_mask_threshold / top_entropy_quantile: token weights are not "
            "translated yet")
    clip_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    options: dict[str, Any] = dict(
        clip_low=args.epsilon, clip_high=clip_high, kl_coef=args.beta, kl_estimator="k3",
        ratio_level=args.importance_sampling_level, agg=_AGGREGATION[loss_type])
    if args.delta is not None:
        options["dual_clip"] = _delta_as_dual_clip(args.delta, clip_high)
    return LossConfig(policy_loss=options)


def _rows_can_be_empty(args: Any) -> bool:
    return bool(args.mask_truncated_completions or args.max_tool_calling_iterations)


def _delta_as_dual_clip(delta: float, clip_high: float) -> float:
    # min(r, delta) in the unclipped term equals dual-clip at c = delta once delta exceeds
    # the upper clip bound: positive advantages then never reach delta unclipped
    if delta <= 1.0 + clip_high:
        raise UnsupportedOptionError(
            f"delta={delta} <= 1 + epsilon_high = {1.0 + clip_high}: rlk expresses TRL's "
            "two-sided clip as dual_clip, which needs delta above the upper clip bound")
    return float(delta)


def _compute_loss(self: Any, model: Any, inputs: dict[str, Any]) -> Tensor:
    """GRPOTrainer._compute_loss with the loss from rlk.policy_loss (TRL's metrics kept)."""
    config = loss_config(self.args)
    completion_ids = inputs["completion_ids"]
    mask = inputs["completion_mask"]
    if "tool_mask" in inputs:
        mask = mask * inputs["tool_mask"]
    logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
        model,
        torch.cat([inputs["prompt_ids"], completion_ids], dim=1),
        torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1),
        completion_ids.size(1),
        compute_entropy=True,
        compute_aux_loss=self.aux_loss_enabled,
        **{name: inputs.get(name) for name in _MODEL_INPUTS},
    )
    old_logps = inputs.get("old_per_token_logps")
    loss, metrics = rlk.policy_loss(
        logps, logps.detach() if old_logps is None else old_logps, inputs["advantages"], mask != 0,
        ref_logp=inputs.get("ref_per_token_logps") if self.beta != 0.0 else None,
        **config.policy_loss)
    training = self.model.training
    if config.scale_by_accumulation and training:
        loss = loss / self.current_gradient_accumulation_steps
    if self.aux_loss_enabled:
        loss = loss + self.router_aux_loss_coef * aux_loss / _accumulation(self, training)
    _log_metrics(self, "train" if training else "eval", metrics, entropies, mask, aux_loss,
                 per_token_clip=config.policy_loss["ratio_level"] == "token")
    return loss


def _accumulation(trainer: Any, training: bool) -> int:
    return trainer.current_gradient_accumulation_steps if training else 1


def _log_metrics(trainer: Any, mode: str, metrics: Mapping[str, Tensor], entropies: Tensor,
                 mask: Tensor, aux_loss: Tensor | None, *, per_token_clip: bool) -> None:
    """TRL's metric names, from rlk's token means, reduced over processes as TRL does.

    TRL counts a sequence-level ratio's clip fraction per sequence, rlk per token, so
    that metric is left out at the sequence level rather than logged with another meaning.
    """
    tokens = mask.sum().float()
    logged = trainer._metrics[mode]

    def global_mean(local_mean: Tensor) -> float:
        totals = trainer.accelerator.reduce(torch.stack([local_mean * tokens, tokens]),
                                            reduction="sum")
        return float(totals[0] / totals[1].clamp(min=1.0))

    if trainer.beta != 0.0:
        logged["kl"].append(global_mean(metrics["mean_kl"]))
    entropy_mean = (entropies * mask).sum() / tokens.clamp(min=1.0)
    logged["entropy"].append(global_mean(entropy_mean.detach()))
    if per_token_clip:
        logged["clip_ratio/region_mean"].append(global_mean(metrics["clip_fraction"]))
    if aux_loss is not None:
        logged["aux_loss"].append(
            trainer.accelerator.gather_for_metrics(aux_loss).mean().item())


# ---------------------------------------------------------------------------
# patching


def _install(patches: Patches) -> None:
    from trl.trainer import grpo_trainer
    from trl.trainer import utils as trl_utils

    patches.swap_everywhere(trl_utils, "selective_log_softmax", selective_log_softmax)
    patches.swap_everywhere(trl_utils, "entropy_from_logits", entropy_from_logits)
    patches.swap_everywhere(trl_utils, "_ChunkedLogProbFunction", LinearLogProbs)
    patches.swap(grpo_trainer.GRPOTrainer, "_compute_loss", _compute_loss)


_ADAPTER = Adapter("trl", SUPPORTED, TESTED, _install)
patch = _ADAPTER.patch
unpatch = _ADAPTER.unpatch
is_patched = _ADAPTER.is_patched
patched = _ADAPTER.patched
