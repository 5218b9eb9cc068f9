"""rlk inside TRL: `patch()` routes GRPOTrainer's log-probs and loss to rlk.

    from rlk.integrations import trl as rlk_trl
    rlk_trl.patch()          # or: with rlk_trl.patched(): trainer.train()

What is routed (docs/integrations/trl.md has the option table):
- `trl.trainer.utils.selective_log_softmax` -> `rlk.logp`, `entropy_from_logits` ->
  `rlk.entropy`, `selective_log_softmax_and_entropy` -> `rlk.logp_entropy`, in the
  logits' dtype;
- the fused LM head's chunked log-prob function (`ChunkedLogProbFunction`, which
  GRPOTrainer's `_get_per_token_logps_and_entropies` runs) -> `rlk.linear_logp` /
  `rlk.linear_logp_entropy`;
- `GRPOTrainer._compute_loss` -> `rlk.linear_policy_loss` inside the fused LM head when
  the configuration needs no per-token log-prob or entropy before the loss (see
  `fuses_head_and_loss`), else `rlk.policy_loss` on the head's log-probs; configured from
  the trainer's `GRPOConfig` by `loss_options`, which raises `UnsupportedOptionError` for a
  setting rlk cannot express.
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

import rlk
from rlk.integrations import trl_metrics
from rlk.integrations._patching import Adapter, Patches, UnsupportedOptionError

SUPPORTED = ((1, 16), (1, 17))  # trl >=1.16,<1.17
TESTED = "trl 1.16.0 with transformers 5.24.0"

# the per-token outputs of TRL's fused LM head that rlk computes (TRL's function serves a
# call that asks for more), and those TRL's function computes when not told
LM_HEAD_OUTPUTS = ("log_probs", "entropy")
TRL_HEAD_DEFAULT_OUTPUTS = ("entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
# inputs GRPOTrainer forwards from the batch to the model (multimodal and token-type fields)
_MODEL_INPUTS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask",
                 "spatial_shapes", "num_tiles", "image_sizes", "token_type_ids",
                 "mm_token_type_ids", "image_position_ids")
# False keeps TRL's log-prob pass and computes the loss from its output (rlk.policy_loss)
# even where rlk.linear_policy_loss could take the LM head and the loss in one op
FUSE_HEAD_AND_LOSS = True


# ---------------------------------------------------------------------------
# log-probabilities and entropy


def selective_log_softmax(logits: Tensor, index: Tensor, temperature: float = 1.0,
                          row_mask: Tensor | None = None) -> Tensor:
    """log-softmax(logits / temperature) at `index` (`[...]`, or `[..., K]` for K tokens a
    position), in the logits' dtype; `row_mask` zeros give 0 and no gradient."""
    return rlk.logp(logits, index, temperature=temperature, mask=row_mask, dtype=logits.dtype)


def entropy_from_logits(logits: Tensor, chunk_size: int = 128) -> Tensor:
    """Entropy of softmax(logits) per row, in the logits' dtype.

    `chunk_size` is accepted for TRL's signature; rlk never holds the probabilities.
    """
    return rlk.entropy(logits, dtype=logits.dtype)


def selective_log_softmax_and_entropy(logits: Tensor, index: Tensor,
                                      entropy_requires_grad: bool = True,
                                      temperature: float = 1.0,
                                      row_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Both in one pass over the logits, in the logits' dtype; masked rows give 0 and 0."""
    logp, entropy = rlk.logp_entropy(logits, index, temperature=temperature, mask=row_mask,
                                     dtype=logits.dtype)
    return logp, entropy if entropy_requires_grad else entropy.detach()


class LinearLogProbs:
    """TRL's `ChunkedLogProbFunction.apply` contract, served by rlk.linear_logp(_entropy).

    Returns (log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1) as TRL does. rlk
    computes the first two; a call that asks for any other (SFTTrainer's `is_top1`,
    DPOTrainer's `mean_logits`, `is_top1` and `log_sum_sq_probs`, KTOTrainer's
    `mean_logits`) runs TRL's own function, whole. The logit scale, soft cap and
    temperature apply in TRL's order; under torch.autocast the GEMM runs in the autocast
    dtype as in TRL, but rlk keeps its logits in float32 where TRL rounds them to that
    dtype. `chunk_size` is TRL's tiling knob; rlk picks its own chunks. While
    `_compute_loss` has armed a fused loss, the call computes that loss instead.
    """

    @staticmethod
    def apply(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
              temperature: float, chunk_size: int, final_logit_softcapping: float | None = None,
              logit_scale: float = 1.0, outputs: tuple[str, ...] = TRL_HEAD_DEFAULT_OUTPUTS,
              ) -> tuple[Tensor | None, ...]:
        if not set(outputs) <= set(LM_HEAD_OUTPUTS):
            from trl.kernels.chunked_logprob import ChunkedLogProbFunction

            return ChunkedLogProbFunction.apply(hidden, weight, bias, targets, temperature,
                                                chunk_size, final_logit_softcapping,
                                                logit_scale, outputs)
        head: dict[str, Any] = dict(bias=bias, temperature=temperature,
                                    softcap=final_logit_softcapping, logit_scale=logit_scale)
        fused = _FUSED_LOSS.get()
        if fused is not None:
            return fused.run(hidden, weight, targets, head), None, None, None, None
        if "entropy" in outputs:
            logp, entropy = rlk.linear_logp_entropy(hidden, weight, targets, **head)
            return logp, entropy, None, None, None
        return rlk.linear_logp(hidden, weight, targets, **head), None, None, None, None


# ---------------------------------------------------------------------------
# the loss: options


# TRL loss_type -> (objective, aggregation); every one counts empty rows as TRL does
_LOSS_TYPES = {
    "grpo": ("ppo", "seq-mean-token-mean"), "bnpo": ("ppo", "token-mean"),
    "dr_grpo": ("ppo", "token-sum"), "dapo": ("ppo", "token-sum"),
    "luspo": ("ppo", "seq-mean-token-sum"), "cispo": ("cispo", "token-sum"),
    "sapo": ("sapo", "seq-mean-token-mean"), "vespo": ("vespo", "token-sum"),
}
# loss types TRL divides by the generation batch's token count (num_items_in_batch)
_GLOBAL_TOKEN_COUNT = ("dapo", "cispo", "vespo")
# TRL clamps VESPO's lambdas to at least this
_VESPO_LAMBDA_MIN = 1e-4


def loss_options(args: Any) -> rlk.PolicyLossOptions:
    """The batch-independent part of a GRPOConfig's loss as rlk.PolicyLossOptions.

    Raises UnsupportedOptionError naming a setting rlk cannot express.
    """
    loss_type = args.loss_type
    if loss_type not in _LOSS_TYPES:
        raise UnsupportedOptionError(
            f"loss_type={loss_type!r}: unknown to the adapter (known: "
            f"{', '.join(map(repr, _LOSS_TYPES))})")
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
        _check_vespo(args)
        settings.update(vespo_k_pos=args.vespo_k_pos, vespo_lambda_pos=args.vespo_lambda_pos,
                        vespo_k_neg=args.vespo_k_neg, vespo_lambda_neg=args.vespo_lambda_neg)
    return rlk.PolicyLossOptions(**settings)


def _check_vespo(args: Any) -> None:
    if args.importance_sampling_level != "token":
        raise UnsupportedOptionError(
            "loss_type='vespo' with importance_sampling_level='sequence': rlk's vespo "
            "weighs sequences itself and takes token-level ratios")
    masks = [name for name, on in (("top_entropy_quantile", args.top_entropy_quantile < 1.0),
                                   ("off_policy_mask_threshold",
                                    args.off_policy_mask_threshold is not None)) if on]
    if masks:
        raise UnsupportedOptionError(
            f"loss_type='vespo' with {masks[0]}: TRL multiplies VESPO's loss by that mask, "
            "rlk's vespo takes importance weights inside its sequence weight")
    small = [name for name in ("vespo_lambda_pos", "vespo_lambda_neg")
             if getattr(args, name) < _VESPO_LAMBDA_MIN]
    if small:
        raise UnsupportedOptionError(
            f"{small[0]}={getattr(args, small[0])}: TRL raises it to {_VESPO_LAMBDA_MIN}, "
            "rlk takes it as given")


def _accumulation(trainer: Any, training: bool) -> int:
    return trainer.current_gradient_accumulation_steps if training else 1


def _normaliser(trainer: Any, inputs: Mapping[str, Any], completions: int,
                training: bool) -> dict[str, Any]:
    """The batch-dependent divisor and scale TRL applies for its loss type."""
    loss_type = trainer.loss_type
    if loss_type in _GLOBAL_TOKEN_COUNT:
        tokens = float(inputs["num_items_in_batch"].clamp(min=1.0))
        tokens /= trainer.accelerator.num_processes
        if training:  # num_items_in_batch spans the generation batch: one accumulation window
            tokens *= _accumulation(trainer, training) / trainer.args.steps_per_generation
        return {"divisor": tokens, "scale": 1.0}
    divisor = {"dr_grpo": float(completions * trainer.max_completion_length)}
    return {**({"divisor": divisor[loss_type]} if loss_type in divisor else {}),
            "scale": 1.0 / _accumulation(trainer, training)}


def _sampling_weights(trainer: Any, inputs: Mapping[str, Any]) -> Tensor | None:
    """vLLM's importance-sampling ratio, where TRL weighs the loss with it (VESPO takes it
    whenever the batch has it, inside its sequence weight)."""
    ratio = inputs.get("importance_sampling_ratio")
    corrected = trainer.use_vllm and trainer.vllm_importance_sampling_correction
    return ratio if corrected or trainer.loss_type == "vespo" else None


# ---------------------------------------------------------------------------
# the loss: the fused path (LM head and loss in one rlk.linear_policy_loss)


def fuses_head_and_loss(trainer: Any, inputs: Mapping[str, Any]) -> bool:
    """Whether this step's loss can run inside the fused LM head: nothing may need a
    per-token log-prob or entropy before the loss (the entropy bonus, the high-entropy
    and off-policy masks, and old log-probs that TRL leaves to the current ones)."""
    return (FUSE_HEAD_AND_LOSS and inputs.get("old_per_token_logps") is not None
            and trainer.top_entropy_quantile >= 1.0
            and trainer.off_policy_mask_threshold is None
            and not trainer._entropy_bonus_enabled)


@dataclass
class _FusedLoss:
    """A loss armed by `_compute_loss` and computed by the fused LM head's next call.

    TRL's head scores either every position of the shifted [B, L - 1] batch, or only the
    labelled ones (the completion tokens, in row-major order); either way the completion
    rows are placed in [B, T] for rlk.linear_policy_loss.
    """

    tokens: Tensor  # completion ids [B, T]
    labelled: Tensor  # bool [B, T]: positions the head has a label for (completion_mask)
    positions: int  # B * (L - 1): the head's rows when it scores every position
    policy: dict[str, Any]  # linear_policy_loss's policy arguments
    result: tuple[Tensor, dict[str, Tensor]] | None = field(default=None)

    def run(self, hidden: Tensor, weight: Tensor, targets: Tensor,
            head: Mapping[str, Any]) -> Tensor:
        """Compute the loss; return the per-row log-probs (detached, 0 where the loss mask
        is) in the layout TRL's head returns them."""
        if self.result is not None:
            raise RuntimeError("TRL's fused LM head ran twice in one loss step; the fused "
                               "loss expects one call (set FUSE_HEAD_AND_LOSS = False)")
        batch, length = self.tokens.shape
        width = hidden.shape[-1]
        every_position = hidden.shape[0] == self.positions
        if every_position:
            rows = hidden.view(batch, -1, width)[:, -length:]
            labels = targets.view(batch, -1)[:, -length:][self.labelled]
        elif hidden.shape[0] == int(self.labelled.sum()):
            rows = hidden.new_zeros(batch, length, width).masked_scatter(
                self.labelled.unsqueeze(-1), hidden)
            labels = targets
        else:
            raise RuntimeError(f"TRL's fused LM head scored {hidden.shape[0]} rows; the fused "
                               f"loss expects {self.positions} or {int(self.labelled.sum())}")
        if not torch.equal(labels, self.tokens[self.labelled]):
            raise RuntimeError("TRL's fused LM head scored other tokens than the completions")
        self.result = rlk.linear_policy_loss(rows, weight, self.tokens, **self.policy, **head)
        logp = self.result[1]["logp"]
        if not every_position:
            return logp[self.labelled]
        return torch.cat([logp.new_zeros(batch, self.positions // batch - length), logp],
                         dim=1).reshape(-1)


_FUSED_LOSS: contextvars.ContextVar[_FusedLoss | None] = contextvars.ContextVar(
    "rlk_trl_fused_loss", default=None)


def _fused_loss(trainer: Any, model: Any, inputs: Mapping[str, Any], input_ids: Tensor,
                attention_mask: Tensor, policy: dict[str, Any],
                ) -> tuple[Tensor, dict[str, Tensor], Tensor | None]:
    """The loss from TRL's own forward, with rlk.linear_policy_loss as its LM head."""
    completion_ids = inputs["completion_ids"]
    fused = _FusedLoss(tokens=completion_ids, labelled=inputs["completion_mask"] != 0,
                       positions=input_ids.shape[0] * (input_ids.shape[1] - 1), policy=policy)
    token = _FUSED_LOSS.set(fused)
    try:
        _, _, aux_loss = trainer._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1),
            compute_aux_loss=trainer.aux_loss_enabled,
            **{name: inputs.get(name) for name in _MODEL_INPUTS})
    finally:
        _FUSED_LOSS.reset(token)
    if fused.result is None:
        raise RuntimeError("the model's forward did not run TRL's fused LM head")
    return (*fused.result, aux_loss)


# ---------------------------------------------------------------------------
# the loss: GRPOTrainer._compute_loss


def _compute_loss(self: Any, model: Any, inputs: dict[str, Any]) -> Tensor:
    """GRPOTrainer._compute_loss with the loss from rlk (TRL's metrics and controller kept)."""
    options = loss_options(self.args)
    completion_ids = inputs["completion_ids"]
    mask = inputs["completion_mask"]
    if "tool_mask" in inputs:
        mask = mask * inputs["tool_mask"]
    input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    training = self.model.training
    advantages = inputs["advantages"]
    policy: dict[str, Any] = dict(
        advantages=advantages, mask=mask,
        ref_logp=inputs.get("ref_per_token_logps") if self.beta != 0.0 else None,
        options=options, **_normaliser(self, inputs, completion_ids.size(0), training))
    if fuses_head_and_loss(self, inputs):
        old_logps = inputs["old_per_token_logps"]
        loss, metrics, aux_loss = _fused_loss(
            self, model, inputs, input_ids, attention_mask,
            dict(policy, old_logp=old_logps, importance_weights=_sampling_weights(self, inputs)))
        logps, entropy_mean = metrics["logp"], metrics["entropy"]
    else:
        logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            **{name: inputs.get(name) for name in _MODEL_INPUTS})
        old_logps = inputs.get("old_per_token_logps")
        old_logps = logps.detach() if old_logps is None else old_logps
        entropy_mask = (self.get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)
                        if self.top_entropy_quantile < 1.0 else None)
        weights = _token_weights(self, inputs, logps, old_logps, advantages, mask, entropy_mask)
        loss, metrics = rlk.policy_loss(logps, old_logps, importance_weights=weights,
                                        **policy)
        entropy_mean = (entropies * mask).sum() / mask.sum().clamp(min=1.0)
        if self._entropy_bonus_enabled:
            bonus_mask = mask if entropy_mask is None else mask * entropy_mask
            self._metrics["train" if training else "eval"]["policy_loss"].append(
                self.accelerator.gather(loss.detach() / policy["scale"]).nanmean().item())
            loss = loss - _entropy_bonus(self, entropies, bonus_mask, training)
    if self.aux_loss_enabled:
        loss = loss + self.router_aux_loss_coef * aux_loss / _accumulation(self, training)
    mode = "train" if training else "eval"
    trl_metrics.log_metrics(self, mode, metrics, entropy_mean, mask, aux_loss)
    trl_metrics.log_ratio_metrics(self, mode, inputs, logps.detach(), old_logps, mask)
    return loss


def _token_weights(trainer: Any, inputs: Mapping[str, Any], logps: Tensor, old_logps: Tensor,
                   advantages: Tensor, mask: Tensor, entropy_mask: Tensor | None,
                   ) -> Tensor | None:
    """TRL's factors on each token's policy term: vLLM's importance-sampling ratio, the
    high-entropy and off-policy masks."""
    factors = [_sampling_weights(trainer, inputs)]
    if entropy_mask is not None:
        factors.append(entropy_mask.float())
    if trainer.off_policy_mask_threshold is not None:
        sampled = inputs.get("sampling_per_token_logps", old_logps)
        factors.append(trainer.get_off_policy_mask(
            advantages=advantages.unsqueeze(1) if advantages.dim() == 1 else advantages,
            per_token_logps=logps, sampling_per_token_logps=sampled, mask=mask,
            off_policy_threshold=trainer.off_policy_mask_threshold).float())
    weights = None
    for factor in factors:
        if factor is not None:
            weights = factor if weights is None else weights * factor
    return weights


def _entropy_bonus(trainer: Any, entropies: Tensor, mask: Tensor, training: bool) -> Tensor:
    """TRL's entropy bonus: the coefficient times the mean entropy over `mask`, per
    accumulation step; with use_adaptive_entropy, TRL 1.16's controller (the coefficient
    applies only while the last window's entropy is at or below entropy_target, and moves
    by entropy_coef_delta at each optimizer step)."""
    args = trainer.args
    adaptive = trainer.use_adaptive_entropy
    coef = trainer.entropy_coef
    if adaptive and not trainer._last_world_entropy <= args.entropy_target:
        coef = 0.0
    bonus = coef * (entropies * mask).sum() / mask.sum().clamp(min=1.0)
    bonus = bonus / _accumulation(trainer, training)
    if adaptive and training:
        stats = torch.stack([(entropies * mask).sum(), mask.sum()]).detach()
        window = trainer._entropy_window_stats
        trainer._entropy_window_stats = stats if window is None else window + stats
        if trainer.accelerator.sync_gradients:
            totals = trainer.accelerator.reduce(trainer._entropy_window_stats, reduction="sum")
            entropy = (totals[0] / totals[1].clamp(min=1.0)).item()
            if entropy <= args.entropy_target:
                trainer.entropy_coef = min(trainer.entropy_coef + args.entropy_coef_delta,
                                           args.entropy_coef_max)
            else:
                trainer.entropy_coef = max(trainer.entropy_coef - args.entropy_coef_delta,
                                           args.entropy_coef_min)
            trainer._last_world_entropy = entropy
            trainer._entropy_window_stats = None
    if training and trainer.accelerator.sync_gradients:
        trainer._metrics["train"]["entropy_coef"].append(trainer.entropy_coef)
    return bonus


# ---------------------------------------------------------------------------
# patching


def _install(patches: Patches) -> None:
    from trl.trainer import grpo_trainer
    from trl.trainer import utils as trl_utils

    patches.swap_everywhere(trl_utils, "selective_log_softmax", selective_log_softmax)
    patches.swap_everywhere(trl_utils, "entropy_from_logits", entropy_from_logits)
    patches.swap_everywhere(trl_utils, "selective_log_softmax_and_entropy",
                            selective_log_softmax_and_entropy)
    patches.swap_everywhere(trl_utils, "_ChunkedLogProbFunction", LinearLogProbs)
    patches.swap(grpo_trainer.GRPOTrainer, "_compute_loss", _compute_loss)


_ADAPTER = Adapter("trl", SUPPORTED, TESTED, _install)
patch = _ADAPTER.patch
unpatch = _ADAPTER.unpatch
is_patched = _ADAPTER.is_patched
patched = _ADAPTER.patched
