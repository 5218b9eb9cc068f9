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


# TRL loss_type -> (objective, aggregation); every one counts empty rows as TRL does
_LOSS_TYPES = {
    "grpo": ("ppo", "seq-mean-token-mean"), "bnpo": ("ppo", "token-mean"),
    "dr_grpo": ("ppo", "token-sum"), "dapo": ("ppo", "token-sum"),
    "luspo": ("ppo", "seq-mean-token-sum"), "cispo": ("cispo", "token-sum"),
    "sapo": ("sapo", "seq-mean-token-mean"), "vespo": ("vespo", "token-sum"),
}
# loss types TRL divides by the generation batch's token count (num_items_in_batch)
_GLOBAL_TOKEN_COUNT = ("dapo", "cispo", "vespo")


def loss_options(args: Any) -> rlk.PolicyLossOptions:
    """The batch-independent part of a GRPOConfig's loss as rlk.PolicyLossOptions.

    Raises UnsupportedOptionError naming a setting rlk cannot express.
    """
    loss_type = args.loss_type
    if loss_type not in _LOSS_TYPES:
        raise UnsupportedOptionError(
            f"loss_type={loss_type!r}: unknown to the adapter (known: "
            f"{', '.join(map(repr, _LOSS_TYPES))})")
    if args.entropy_coef != 0.0 or args.use_adaptive_entropy:
        raise UnsupportedOptionError(
            f"entropy_coef={args.entropy_coef}, use_adaptive_entropy="
            f"{args.use_adaptive_entropy}: the entropy bonus is not translated yet")
    if args.use_vllm:
        raise UnsupportedOptionError(
            "use_vllm=True: the adapter is not tested with vLLM's importance-sampling "
            "correction")
    objective, agg = _LOSS_TYPES[loss_type]
    clip_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    settings: dict[str, Any] = dict(
        objective=objective, agg=agg, clip_low=args.epsilon, clip_high=clip_high,
        kl_coef=args.beta, kl_estimator="k3",
        kl_bias_correction=bool(args.beta != 0.0 and args.use_bias_correction_kl),
        ratio_level=args.importance_sampling_level,
        count_empty_rows=agg.startswith("seq-mean"))
    if objective == "ppo" and args.delta is not None:
        settings["ratio_cap"] = args.delta
    if objective == "cispo":
        # TRL bounds the weight above by epsilon_high itself and not below
        if clip_high < 1.0:
            raise UnsupportedOptionError(
                f"loss_type='cispo' with epsilon_high={clip_high}: TRL caps the weight at "
                "epsilon_high, below 1; rlk's cap is 1 + clip_high")
        settings.update(clip_low=1.0, clip_high=clip_high - 1.0)
    if objective == "sapo":
        settings.update(sapo_temperature_pos=args.sapo_temperature_pos,
                        sapo_temperature_neg=args.sapo_temperature_neg)
    if objective == "vespo":
        if args.importance_sampling_level != "token":
            raise UnsupportedOptionError(
                "loss_type='vespo' with importance_sampling_level='sequence': rlk's vespo "
                "weighs sequences itself and takes token-level ratios")
        settings.update(vespo_k_pos=args.vespo_k_pos, vespo_lambda_pos=args.vespo_lambda_pos,
                        vespo_k_neg=args.vespo_k_neg, vespo_lambda_neg=args.vespo_lambda_neg)
    return rlk.PolicyLossOptions(**settings)


def _normaliser(trainer: Any, inputs: Mapping[str, Any], completions: int,
                training: bool) -> dict[str, Any]:
    """The batch-dependent divisor and scale TRL applies for its loss type."""
    loss_type = trainer.loss_type
    accumulation = trainer.current_gradient_accumulation_steps if training else 1
    if loss_type in _GLOBAL_TOKEN_COUNT:
        tokens = float(inputs["num_items_in_batch"].clamp(min=1.0))
        tokens /= trainer.accelerator.num_processes
        if training:
            tokens *= accumulation / trainer.args.steps_per_generation
        return {"divisor": tokens, "scale": 1.0}
    divisor = {"dr_grpo": float(completions * trainer.max_completion_length)}
    return {**({"divisor": divisor[loss_type]} if loss_type in divisor else {}),
            "scale": 1.0 / accumulation}


def _compute_loss(self: Any, model: Any, inputs: dict[str, Any]) -> Tensor:
    """GRPOTrainer._compute_loss with the loss from rlk.policy_loss (TRL's metrics kept)."""
    options = loss_options(self.args)
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
    advantages = inputs["advantages"]
    old_logps = inputs.get("old_per_token_logps")
    old_logps = logps.detach() if old_logps is None else old_logps
    weights = _token_weights(self, inputs, logps, old_logps, advantages, entropies, mask)
    training = self.model.training
    loss, metrics = rlk.policy_loss(
        logps, old_logps, advantages, mask,
        ref_logp=inputs.get("ref_per_token_logps") if self.beta != 0.0 else None,
        importance_weights=weights, options=options,
        **_normaliser(self, inputs, completion_ids.size(0), training))
    if self.aux_loss_enabled:
        loss = loss + self.router_aux_loss_coef * aux_loss / _accumulation(self, training)
    _log_metrics(self, "train" if training else "eval", options, metrics, entropies, mask,
                 aux_loss)
    return loss


def _token_weights(trainer: Any, inputs: Mapping[str, Any], logps: Tensor, old_logps: Tensor,
                   advantages: Tensor, entropies: Tensor, mask: Tensor) -> Tensor | None:
    """TRL's factors on each token's policy term: the high-entropy and off-policy masks."""
    weights = None
    if trainer.top_entropy_quantile < 1.0:
        weights = trainer.get_high_entropy_mask(entropies, mask,
                                                1 - trainer.top_entropy_quantile).float()
    if trainer.off_policy_mask_threshold is not None:
        sampled = inputs.get("sampling_per_token_logps", old_logps)
        keep = trainer.get_off_policy_mask(
            advantages=advantages.unsqueeze(1) if advantages.dim() == 1 else advantages,
            per_token_logps=logps, sampling_per_token_logps=sampled, mask=mask,
            off_policy_threshold=trainer.off_policy_mask_threshold).float()
        weights = keep if weights is None else weights * keep
    return weights


def _accumulation(trainer: Any, training: bool) -> int:
    return trainer.current_gradient_accumulation_steps if training else 1


def _log_metrics(trainer: Any, mode: str, options: rlk.PolicyLossOptions,
                 metrics: Mapping[str, Tensor], entropies: Tensor, mask: Tensor,
                 aux_loss: Tensor | None) -> None:
    """TRL's metric names from rlk's metrics, reduced over processes as TRL does.

    rlk averages a sequence-level ratio's clip statistics over sequences, as TRL does.
    """
    tokens = mask.sum().float()
    sequences = torch.tensor(float(mask.shape[0]), device=mask.device)
    logged = trainer._metrics[mode]

    def global_mean(local_mean: Tensor, count: Tensor = tokens) -> float:
        totals = trainer.accelerator.reduce(torch.stack([local_mean * count, count]),
                                            reduction="sum")
        return float(totals[0] / totals[1].clamp(min=1.0))

    if trainer.beta != 0.0:
        logged["kl"].append(global_mean(metrics["mean_kl"]))
    entropy_mean = (entropies * mask).sum() / tokens.clamp(min=1.0)
    logged["entropy"].append(global_mean(entropy_mean.detach()))
    clip_count = tokens if options.ratio_level == "token" else sequences
    if options.objective == "ppo":
        low, high = metrics["clip_low_fraction"], metrics["clip_high_fraction"]
        # TRL's region is low or high (disjoint: they need advantages of opposite signs)
        for name, value in (("low_mean", low), ("high_mean", high), ("region_mean", low + high)):
            logged[f"clip_ratio/{name}"].append(global_mean(value, clip_count))
    elif options.objective == "cispo":
        logged["cispo_clip_ratio"].append(global_mean(metrics["clip_high_fraction"], clip_count))
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
