"""Conformance cases of `policy_loss`: every option, input dtypes and the edge cases.

Each case is kernel-level arguments (tensors as `_prepare` leaves them, `options` a
`PolicyLossOptions`), logp in the dtype under test. Log ratios stay small and random, so
no ratio sits within rounding of a clip bound.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from rlk._runtime.spec import Sample
from rlk.ops.policy_loss.options import AGGREGATIONS, KL_ESTIMATORS, PolicyLossOptions

# option sets, each a case (the data beside them: see `_case`)
OPTION_CASES: dict[str, dict[str, Any]] = {
    "ppo": {},
    "dapo-clip-higher": {"clip_high": 0.28},
    "dual-clip": {"dual_clip": 2.0, "clip_low": 0.1, "clip_high": 0.1},
    "ratio-cap-delta": {"ratio_cap": 1.15, "clip_low": 0.1, "clip_high": 0.1},
    "log-ratio-clamp": {"log_ratio_min": -0.2, "log_ratio_max": 0.15},
    "gspo": {"ratio_level": "sequence", "clip_low": 0.03, "clip_high": 0.04,
             "agg": "seq-mean-token-mean"},
    "gspo-token-mean": {"ratio_level": "sequence", "clip_low": 0.03, "clip_high": 0.04},
    "gspo-token-form": {"ratio_level": "sequence-token", "clip_low": 0.03, "clip_high": 0.04,
                        "log_ratio_max": 0.05},
    "cispo-trl": {"objective": "cispo", "clip_low": 1.0, "clip_high": 0.1},
    "cispo-verl": {"objective": "cispo", "clip_low": 0.1, "clip_high": 0.1,
                   "log_ratio_min": -20.0, "log_ratio_max": 20.0},
    "cispo-sequence": {"objective": "cispo", "ratio_level": "sequence", "clip_high": 0.05},
    "sapo": {"objective": "sapo", "agg": "seq-mean-token-mean"},
    "sapo-sequence": {"objective": "sapo", "ratio_level": "sequence",
                      "sapo_temperature_pos": 2.0, "sapo_temperature_neg": 3.0},
    "vespo": {"objective": "vespo", "agg": "token-sum", "divisor": 20.0},
    "kl-clamp": {"kl_coef": 0.1, "kl_clamp": 0.03},
    "kl-bias-correction": {"kl_coef": 0.1, "kl_bias_correction": True},
    "kl-bias-correction-sequence": {"kl_coef": 0.1, "kl_bias_correction": True,
                                    "ratio_level": "sequence", "agg": "seq-mean-token-mean"},
    "kl-metric-only": {"kl_estimator": "k2"},
    "tis": {"tis_cap": 1.2},
    "is-uncapped": {"agg": "seq-mean-token-sum"},
    "grpo-trl-empty-rows": {"agg": "seq-mean-token-mean", "count_empty_rows": True,
                            "scale": 0.5},
    "dr-grpo-trl": {"agg": "token-sum", "divisor": 64.0, "scale": 0.25},
    "luspo": {"ratio_level": "sequence", "agg": "seq-mean-token-sum", "count_empty_rows": True},
}
OPTION_CASES.update({f"kl-{name}": {"kl_coef": 0.05, "kl_estimator": name,
                                    "agg": "seq-mean-token-mean"} for name in KL_ESTIMATORS})
OPTION_CASES.update({f"agg-{name}": {"agg": name} for name in AGGREGATIONS})
# which optional inputs each case needs besides the defaults
NEEDS_REF = ("kl-", )
NEEDS_ROLLOUT = ("tis", "is-uncapped", "vespo")


def _case(gen: torch.Generator, device: torch.device, dtype: torch.dtype, name: str,
          options: dict[str, Any], *, batch: int = 4, length: int = 9, per_token: bool = False,
          ref: bool = False, rollout: bool = False, weights: str | None = None,
          spread: float = 0.25, mask_dtype: torch.dtype = torch.float32,
          companion_dtype: torch.dtype = torch.float32) -> Sample:
    def noise(scale: float) -> Tensor:
        return torch.randn(batch, length, generator=gen) * scale

    logp = (-torch.rand(batch, length, generator=gen) * 3).to(dtype)
    old = logp.double() + noise(spread)
    mask = torch.rand(batch, length, generator=gen) > 0.25
    if batch > 0:
        mask[0] = True
    adv_shape = (batch, length) if per_token else (batch,)
    weight_shape = {"token": (batch, length), "sequence": (batch,)}.get(weights or "")
    args: dict[str, Any] = {
        "logp": logp,
        "old_logp": old.to(companion_dtype),
        "advantages": torch.randn(*adv_shape, generator=gen),
        "mask": mask.to(mask_dtype),
        "ref_logp": (logp.double() + noise(0.3)).to(companion_dtype) if ref else None,
        "rollout_logp": (old + noise(0.4)).to(companion_dtype) if rollout else None,
        "importance_weights": (None if weight_shape is None
                               else torch.rand(*weight_shape, generator=gen) + 0.5),
        "options": PolicyLossOptions(**options),
    }
    args = {key: value.to(device) if isinstance(value, Tensor) else value
            for key, value in args.items()}
    return Sample(name, args)


def samples(device: torch.device, dtype: torch.dtype) -> Iterator[Sample]:
    gen = torch.Generator().manual_seed(31)

    def case(name: str, options: dict[str, Any] | None = None, **data: Any) -> Sample:
        return _case(gen, device, dtype, name, OPTION_CASES.get(name, {}) if options is None
                     else options, **data)

    for name in OPTION_CASES:
        yield case(name, ref=name.startswith(NEEDS_REF) or "kl_coef" in OPTION_CASES[name],
                   rollout=name.startswith(NEEDS_ROLLOUT))
    yield case("per-token-advantages", {"dual_clip": 2.0}, per_token=True, spread=1.0)
    yield case("importance-weights-token", {"kl_coef": 0.1}, ref=True, weights="token")
    yield case("importance-weights-sequence", {"tis_cap": 1.1}, rollout=True,
               weights="sequence")
    yield case("vespo-importance-weights", OPTION_CASES["vespo"], rollout=True, weights="token",
               per_token=True)
    yield case("gspo-per-token-everything", OPTION_CASES["gspo-token-mean"] | {
        "kl_coef": 0.1, "kl_bias_correction": True, "tis_cap": 1.3}, per_token=True, ref=True,
        rollout=True, weights="token")
    yield case("mask-bool-companions-bf16", {"kl_coef": 0.1}, ref=True,
               mask_dtype=torch.bool, companion_dtype=torch.bfloat16)
    yield case("mask-int64-companions-f64", {"ratio_level": "sequence"},
               mask_dtype=torch.int64, companion_dtype=torch.float64)
    yield case("mask-uint8-companions-f16", {"tis_cap": 1.5}, rollout=True,
               mask_dtype=torch.uint8, companion_dtype=torch.float16)
    sample = case("dual-clip-binding", OPTION_CASES["dual-clip"], spread=1.0)
    sample.args["advantages"][1] = -1.0  # ratios above dual_clip with a negative advantage
    sample.args["old_logp"][1] = sample.args["logp"][1].float() - 1.5
    yield sample
    sample = case("masked-garbage", {"kl_coef": 0.1, "tis_cap": 2.0}, ref=True, rollout=True,
                  per_token=True, weights="token")
    hidden = sample.args["mask"] == 0
    for key, value in (("logp", float("nan")), ("old_logp", float("inf")),
                       ("advantages", float("nan")), ("ref_logp", float("-inf")),
                       ("rollout_logp", float("nan")), ("importance_weights", float("inf"))):
        sample.args[key][hidden] = value
    yield sample
    for name, options in (("nan-logp-token", {}), ("nan-logp-sequence", OPTION_CASES["gspo"])):
        sample = case(name, options)
        sample.args["logp"][0, 3] = float("nan")  # a real token: NaN loss, NaN gradient there
        yield sample
    sample = case("empty-sequence", {"agg": "seq-mean-token-mean", "ratio_level": "sequence"})
    sample.args["mask"][3] = 0
    yield sample
    yield case("empty", {"agg": "seq-mean-token-mean"}, batch=0, length=5)
    yield case("no-tokens", {"agg": "seq-mean-token-sum-norm"}, batch=3, length=0)
