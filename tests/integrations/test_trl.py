"""rlk.integrations.trl against TRL itself: GRPOTrainer runs with and without patch().

Each case trains a tiny random Qwen2 for a few steps on CPU in float32, once with TRL's
own code and once patched, from the same weights and seed, and compares every step's
loss, KL, gradient norm, entropy, clip metrics and every parameter's gradient (before
the optimizer step).

Each patched step starts from the parameters TRL's own run had at that step, so a step
compares one step's computation. Left to run free, two float32 runs that differ by
rounding (rlk's float32 logits against TRL's chunked ones, another summation order in the
loss) drift apart: at learning rate 2, SAPO's smooth weights carry a 1e-7 difference in
the first step to 6e-5 by the fourth, while each step's loss, evaluated on identical
inputs, agrees with TRL's to 8e-8 (docs/integrations/trl.md has the tables).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from rlk.integrations import UnsupportedOptionError
from rlk.integrations import trl as rlk_trl

from .conftest import example, require
from .trainer_steps import StepRecorder, assert_grads_match, assert_logs_match, step_logs

trl = require("trl")
datasets = require("datasets")

TOLERANCE = 1e-5
# the step logs of the per-step difference table (trl_step_differences.py)
LOGGED = ("loss", "grad_norm", "kl", "entropy", "clip_ratio/low_mean", "clip_ratio/high_mean",
          "clip_ratio/region_mean", "cispo_clip_ratio", "policy_loss", "entropy_coef")
STEPS = 4
PROMPTS = ["1+2=", "3+4=", "5+5=", "9+1=", "2+7=", "8+8="]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return example().save_tiny_qwen2(tmp_path_factory.mktemp("tiny-qwen2"))


def digits_reward(completions: list[str], **_: Any) -> list[float]:
    """A reward with spread inside each group: ones count double, other digits once."""
    return [sum(2.0 if c == "1" else 1.0 for c in text if c.isdigit()) / 4 for text in completions]


class VLLMCorrectedTrainer(trl.GRPOTrainer):
    """GRPOTrainer whose loss sees a vLLM importance-sampling ratio, without vLLM.

    Generation stays TRL's own; each generated batch gets a ratio in [0.5, 1.5] (per token,
    or per sequence for TRL's sequence modes) drawn from a generator both runs share the
    seed of, and the loss runs with use_vllm and vllm_importance_sampling_correction on.
    """

    ratio_level = "token"

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if not hasattr(self, "_ratio_generator"):
            self._ratio_generator = torch.Generator().manual_seed(11)
        mask = output["completion_mask"]
        shape = mask.shape if self.ratio_level == "token" else (mask.shape[0], 1)
        ratio = torch.rand(shape, generator=self._ratio_generator) + 0.5
        # TRL's ratio is exp(0) = 1 at masked tokens
        output["importance_sampling_ratio"] = torch.where(mask != 0, ratio, 1.0) \
            if self.ratio_level == "token" else ratio
        return output

    def _compute_loss(self, model, inputs):
        self.use_vllm = self.vllm_importance_sampling_correction = True
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self.use_vllm = False


def run_grpo(model_dir: Path, tmp_path: Path, start_from: StepRecorder | None = None,
             trainer_class: type = trl.GRPOTrainer, **options: Any) -> dict[str, Any]:
    """Train for STEPS steps; per-step logs, and the recorder of parameters and gradients."""
    settings: dict[str, Any] = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4,
        gradient_accumulation_steps=2, num_generations=4, max_completion_length=6,
        num_iterations=2, max_steps=STEPS, learning_rate=2.0, optim="sgd",
        lr_scheduler_type="constant",
        logging_steps=1, report_to=[], use_cpu=True, seed=7, save_strategy="no",
        disable_tqdm=True, bf16=False)
    settings.update(options)
    recorder = StepRecorder(start_from)
    trainer = trainer_class(
        model=str(model_dir), reward_funcs=digits_reward, args=trl.GRPOConfig(**settings),
        train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS * 4}),
        callbacks=[recorder])
    trainer.train()
    return {"logs": step_logs(trainer), "recorder": recorder}


def step_differences(expected: dict[str, Any], got: dict[str, Any]) -> list[dict[str, float]]:
    """Per step: |rlk - TRL| / (1 + |TRL|) of each logged value, and its largest over every
    parameter's gradient entries ("grads") (tests/integrations/trl_step_differences.py)."""
    steps = []
    for want, have, want_grads, have_grads in zip(
            expected["logs"], got["logs"], expected["recorder"].grads, got["recorder"].grads,
            strict=True):
        assert want_grads.keys() == have_grads.keys()
        row = {key: abs(have[key] - want[key]) / (1 + abs(want[key]))
               for key in LOGGED if key in have}
        row["grads"] = max(float(((have_grads[name] - want_grads[name]).abs()
                                  / (1 + want_grads[name].abs())).max()) for name in want_grads)
        steps.append(row)
    return steps


def assert_runs_match(expected: dict[str, Any], got: dict[str, Any]) -> None:
    """Every value TRL logs (loss, KL, entropy, clip statistics, rewards...) and every
    parameter gradient, at each of the STEPS steps."""
    assert len(expected["logs"]) == STEPS
    assert_logs_match(expected["logs"], got["logs"], TOLERANCE)
    assert_grads_match(expected["recorder"], got["recorder"], TOLERANCE)


def trainer_case(loss_type: str, beta: float, corrected: bool, level: str, **extra: Any):
    options = dict(loss_type=loss_type, beta=beta, use_bias_correction_kl=corrected,
                   importance_sampling_level=level, **extra)
    if loss_type == "cispo":
        options.setdefault("epsilon_high", 4.0)  # TRL's cap on the weight itself
    name = f"{loss_type}-beta{beta}{'-corrected' if corrected else ''}-{level}"
    return pytest.param(options, id="-".join([name, *map(str, extra)]))


LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo", "vespo")
MATCHED = [
    *(trainer_case(loss_type, beta, corrected, "token")
      for loss_type in LOSS_TYPES
      for beta, corrected in ((0.0, False), (0.04, False), (0.04, True))),
    *(trainer_case(loss_type, 0.04, True, "sequence")
      for loss_type in LOSS_TYPES if loss_type != "vespo"),
    trainer_case("bnpo", 0.0, False, "token", delta=1.5, epsilon_high=0.28),
    trainer_case("bnpo", 0.0, False, "token", delta=1.1),
    trainer_case("grpo", 0.0, False, "token", mask_truncated_completions=True),
    # empty rows under sequence-level ratios: TRL's clip statistics count them (never clipped)
    trainer_case("grpo", 0.04, True, "sequence", mask_truncated_completions=True),
    trainer_case("bnpo", 0.0, False, "sequence", mask_truncated_completions=True, delta=1.5),
    trainer_case("cispo", 0.0, False, "sequence", mask_truncated_completions=True,
                 epsilon_high=1.0),
    trainer_case("luspo", 0.0, False, "sequence", mask_truncated_completions=True),
    trainer_case("vespo", 0.04, True, "token", mask_truncated_completions=True),
    trainer_case("dapo", 0.0, False, "token", top_entropy_quantile=0.5),
    trainer_case("grpo", 0.0, False, "token", off_policy_mask_threshold=0.01),
    trainer_case("bnpo", 0.04, True, "token", entropy_coef=0.05),
    trainer_case("dapo", 0.0, False, "token", entropy_coef=0.05, top_entropy_quantile=0.5),
    trainer_case("grpo", 0.0, False, "token", use_adaptive_entropy=True, entropy_target=5.0,
                 entropy_coef=0.01, entropy_coef_delta=0.05),
    trainer_case("luspo", 0.0, False, "token", use_adaptive_entropy=True, entropy_target=0.5,
                 entropy_coef=0.2, entropy_coef_delta=0.05),
]


def test_the_matrix_covers_every_loss_type() -> None:
    assert {case.values[0]["loss_type"] for case in MATCHED} == set(LOSS_TYPES)


@pytest.fixture(params=["fused", "unfused"])
def head_and_loss(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> list:
    """Run the patched trainer with the fused LM head and loss allowed or not; the list
    collects the fused loss's calls."""
    monkeypatch.setattr(rlk_trl, "FUSE_HEAD_AND_LOSS", request.param == "fused")
    calls: list = []
    run = rlk_trl._FusedLoss.run

    def counted(self, *args, **kwargs):
        calls.append(self)
        return run(self, *args, **kwargs)

    monkeypatch.setattr(rlk_trl._FusedLoss, "run", counted)
    return calls


def fusable(options: dict[str, Any]) -> bool:
    """The configurations whose loss rlk.linear_policy_loss takes (old log-probs exist:
    num_iterations=2)."""
    return (options.get("top_entropy_quantile", 1.0) == 1.0
            and options.get("off_policy_mask_threshold") is None
            and not options.get("entropy_coef") and not options.get("use_adaptive_entropy"))


@pytest.mark.parametrize("options", MATCHED)
def test_grpo_trainer_matches_trl(model_dir: Path, tmp_path: Path, options: dict,
                                  head_and_loss: list) -> None:
    expected = run_grpo(model_dir, tmp_path / "trl", **options)
    with rlk_trl.patched():
        got = run_grpo(model_dir, tmp_path / "rlk", start_from=expected["recorder"], **options)
    assert not rlk_trl.is_patched()
    assert_runs_match(expected, got)
    assert bool(head_and_loss) == (rlk_trl.FUSE_HEAD_AND_LOSS and fusable(options))


VLLM_CASES = [pytest.param(loss_type, level, id=f"{loss_type}-{level}")
              for loss_type in ("grpo", "dapo", "cispo", "sapo", "vespo")
              for level in ("token", "sequence") if (loss_type, level) != ("vespo", "sequence")]


@pytest.mark.parametrize(("loss_type", "ratio_level"), VLLM_CASES)
def test_vllm_importance_sampling_correction_matches_trl(model_dir: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         loss_type: str,
                                                         ratio_level: str) -> None:
    monkeypatch.setattr(VLLMCorrectedTrainer, "ratio_level", ratio_level)
    options = dict(loss_type=loss_type, beta=0.04, trainer_class=VLLMCorrectedTrainer,
                   **({"epsilon_high": 4.0} if loss_type == "cispo" else {}))
    expected = run_grpo(model_dir, tmp_path / "trl", **options)
    with rlk_trl.patched():
        got = run_grpo(model_dir, tmp_path / "rlk", start_from=expected["recorder"], **options)
    assert_runs_match(expected, got)


REFUSED = [
    pytest.param(dict(loss_type="cispo"), "epsilon_high=0.2", id="cispo-cap-below-1"),
    pytest.param(dict(loss_type="vespo", importance_sampling_level="sequence"),
                 "importance_sampling_level='sequence'", id="vespo-sequence"),
    pytest.param(dict(loss_type="vespo", top_entropy_quantile=0.5), "top_entropy_quantile",
                 id="vespo-entropy-mask"),
    pytest.param(dict(loss_type="vespo", off_policy_mask_threshold=0.1),
                 "off_policy_mask_threshold", id="vespo-off-policy-mask"),
]


@pytest.mark.parametrize(("options", "message"), REFUSED)
def test_unsupported_options_raise(model_dir: Path, tmp_path: Path, options: dict,
                                   message: str) -> None:
    with rlk_trl.patched(), pytest.raises(UnsupportedOptionError, match=message):
        run_grpo(model_dir, tmp_path, max_steps=1, **options)
