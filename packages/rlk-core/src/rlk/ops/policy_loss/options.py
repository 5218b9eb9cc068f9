"""`PolicyLossOptions`: every option of `rlk.policy_loss`, its default and its validation.

This dataclass is the only place a policy-loss default is written. The public function,
the conformance samples, the float64 reference and every backend read their settings from
it; docs/ops/policy_loss.md defines each option by its formula and its source.
"""

from __future__ import annotations

from typing import ClassVar

from rlk._runtime.options import Options, choice, flag, number, option_set, optional_number

OBJECTIVES = ("ppo", "cispo", "sapo", "vespo")
RATIO_LEVELS = ("token", "sequence", "sequence-token")
# a trailing "+" keeps the estimator's value and takes k2's gradient (verl's straight-through)
KL_ESTIMATORS = ("k1", "k2", "k3", "abs", "k1+", "k3+", "abs+")
AGGREGATIONS = ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum",
                "seq-mean-token-sum-norm")
SEQUENCE_AGGREGATIONS = AGGREGATIONS[2:]
# What every backend's forward returns besides the loss, in this order. The first four are
# clip statistics: token means, or per-sequence means averaged over sequences when the ratio
# is a sequence's (one ratio per sequence is clipped or not as a whole).
METRICS = ("clip_fraction", "clip_low_fraction", "clip_high_fraction", "dual_clip_fraction",
           "mean_ratio", "mean_kl", "truncated_fraction")
CLIP_METRICS = 4


@option_set
class PolicyLossOptions(Options):
    """How `rlk.policy_loss` turns per-token log-probs into one loss (see the docs page).

    Objective: `objective` "ppo" (clipped surrogate), "cispo" (clipped importance weight
    times logp), "sapo" (soft sigmoid gate), "vespo" (gamma-weighted sequence weight);
    `clip_low`/`clip_high` bound the ratio to [1 - clip_low, 1 + clip_high];
    `dual_clip` (> 1) bounds the loss of negative advantages; `ratio_cap` caps the ratio
    of the unclipped branch (TRL's two-sided `delta`); `ratio_level` "token", "sequence"
    (GSPO, exact gradient) or "sequence-token" (GSPO-token: the sequence ratio's value,
    each token's own gradient); `log_ratio_min`/`log_ratio_max` clamp the log ratio
    (verl: ±20). SAPO temperatures and VESPO's gamma parameters as TRL names them.
    KL: `kl_coef` times `kl_estimator` of logp - ref_logp, optionally clamped to
    ±`kl_clamp`, optionally times the differentiable ratio (`kl_bias_correction`).
    `tis_cap` truncates the rollout importance weight exp(old_logp - rollout_logp).
    Aggregation: `agg`, with `divisor` replacing its token or sequence count,
    `count_empty_rows` counting fully masked rows as sequences, and `scale` a factor.
    """

    op_name: ClassVar[str] = "policy_loss"

    objective: str = choice("ppo", OBJECTIVES)
    clip_low: float = number(0.2, low=0.0, high=1.0)
    clip_high: float = number(0.2, low=0.0)
    dual_clip: float | None = optional_number(low=1.0, low_strict=True)
    ratio_cap: float | None = optional_number(low=1.0, low_strict=True)
    ratio_level: str = choice("token", RATIO_LEVELS)
    log_ratio_min: float | None = optional_number(high=0.0, high_strict=True)
    log_ratio_max: float | None = optional_number(low=0.0, low_strict=True)
    sapo_temperature_pos: float = number(1.0, low=0.0, low_strict=True)
    sapo_temperature_neg: float = number(1.05, low=0.0, low_strict=True)
    vespo_k_pos: float = number(2.0, low=0.0)
    vespo_lambda_pos: float = number(3.0, low=0.0, low_strict=True)
    vespo_k_neg: float = number(3.0, low=0.0)
    vespo_lambda_neg: float = number(2.0, low=0.0, low_strict=True)
    kl_coef: float = number(0.0, low=0.0)
    kl_estimator: str = choice("k3", KL_ESTIMATORS)
    kl_clamp: float | None = optional_number(low=0.0, low_strict=True)
    kl_bias_correction: bool = flag(False)
    tis_cap: float | None = optional_number(low=0.0, low_strict=True)
    agg: str = choice("token-mean", AGGREGATIONS)
    divisor: float | None = optional_number(low=0.0, low_strict=True)
    count_empty_rows: bool = flag(False)
    scale: float = number(1.0, low=0.0, low_strict=True)

    def check_combination(self) -> None:
        only_ppo = [name for name in ("dual_clip", "ratio_cap") if getattr(self, name) is not None]
        if only_ppo and self.objective != "ppo":
            raise ValueError(f"{only_ppo[0]} applies to objective 'ppo' only; got objective "
                             f"{self.objective!r}")
        if self.objective == "vespo":
            if self.ratio_level != "token":
                raise ValueError("objective 'vespo' weighs whole sequences itself and takes "
                                 f"ratio_level 'token'; got {self.ratio_level!r}")
            if self.log_ratio_min is not None or self.log_ratio_max is not None:
                raise ValueError("objective 'vespo' clamps its log ratios as TRL does; "
                                 "log_ratio_min/log_ratio_max must be None")
        if self.count_empty_rows and self.agg not in SEQUENCE_AGGREGATIONS:
            raise ValueError(f"count_empty_rows counts sequences, which agg {self.agg!r} does "
                             "not; use a seq-mean-* aggregation or leave it False")

    @property
    def needs_sequence_pass(self) -> bool:
        """True when a token's loss or gradient depends on a statistic of its whole sequence
        (the sequence ratio, VESPO's sequence weight): such options need every logp of a
        sequence before any of its gradients. Token-level options need only the mask."""
        return self.ratio_level != "token" or self.objective == "vespo"

    @property
    def kl_base(self) -> str:
        """The KL estimator whose value is used ("k3+" -> "k3")."""
        return self.kl_estimator.rstrip("+")

    @property
    def kl_straight_through(self) -> bool:
        """The KL gradient is k2's (logp - ref_logp) whatever the estimator's value."""
        return self.kl_estimator.endswith("+")
