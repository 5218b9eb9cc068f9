"""rlk.integrations.trl against TRL itself: GRPOTrainer runs with and without patch().

Each case trains a tiny random Qwen2 for a few steps on CPU in float32, once with TRL's
own code and once patched, from the same weights and seed, and compares every step's
loss, KL and gradient norm and every parameter's gradient (before the optimizer step).
SGD keeps the two runs' parameters as close as their gradients (Adam would turn a
1e-9 gradient difference on a near-zero entry into a full step).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from rlk.integrations import UnsupportedOptionError
from rlk.integrations import trl as rlk_trl

from .conftest import example, require

trl = require("trl")
transformers = require("transformers")
datasets = require("datasets")

TOLERANCE = 1e-5
# the step logs compared; the adapter logs each of them that TRL logs for the configuration
LOGGED = ("loss", "grad_norm", "kl", "entropy", "clip_ratio/region_mean")
STEPS = 4
PROMPTS = ["1+2=", "3+4=", "5+5=", "9+1=", "2+7=", "8+8="]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return example().save_tiny_qwen2(tmp_path_factory.mktemp("tiny-qwen2"))


def digits_reward(completions: list[str], **_: Any) -> list[float]:
    """A reward with spread inside each group: ones count double, other digits once."""
    return [sum(2.0 if c == "1" else 1.0 for c in text if c.isdigit()) / 4 for text in completions]


class GradientRecorder(transformers.TrainerCallback):
    """Every parameter's gradient just before each optimizer step."""

    def __init__(self) -> None:
        self.steps: list[dict[str, torch.Tensor]] = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.steps.append({name: p.grad.detach().clone() for name, p in model.named_parameters()
                           if p.grad is not None})


def run_grpo(model_dir: Path, tmp_path: Path, **options: Any) -> dict[str, Any]:
    """Train for STEPS steps; per-step logs and gradients."""
    settings: dict[str, Any] = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4,
        gradient_accumulation_steps=2, num_generations=4, max_completion_length=6,
        num_iterations=2, max_steps=STEPS, learning_rate=2.0, optim="sgd",
        lr_scheduler_type="constant",
        logging_steps=1, report_to=[], use_cpu=True, seed=7, save_strategy="no",
        disable_tqdm=True, bf16=False)
    settings.update(options)
    recorder = GradientRecorder()
    trainer = trl.GRPOTrainer(
        model=str(model_dir), reward_funcs=digits_reward, args=trl.GRPOConfig(**settings),
        train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS * 4}),
        callbacks=[recorder])
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    return {"logs": logs, "grads": recorder.steps}


def assert_runs_match(expected: dict[str, Any], got: dict[str, Any]) -> None:
    assert len(got["logs"]) == len(expected["logs"]) == STEPS
    for step, (want, have) in enumerate(zip(expected["logs"], got["logs"], strict=True)):
        for key in LOGGED:
            if key in have:
                assert math.isclose(have[key], want[key], rel_tol=TOLERANCE,
                                    abs_tol=TOLERANCE), (step, key, want[key], have[key])
    assert len(got["grads"]) == len(expected["grads"]) == STEPS
    for step, (want, have) in enumerate(zip(expected["grads"], got["grads"], strict=True)):
        assert want.keys() == have.keys()
        for name in want:
            torch.testing.assert_close(have[name], want[name], rtol=TOLERANCE, atol=TOLERANCE,
                                       msg=lambda m, n=name, s=step: f"step {s} {n}: {m}")


MATCHED = [
    pytest.param(dict(loss_type=loss_type, beta=beta, use_bias_correction_kl=False,
                      importance_sampling_level=level),
                 id=f"{loss_type}-beta{beta}-{level}")
    for loss_type in ("grpo", "bnpo", "luspo")
    for beta in (0.0, 0.04)
    for level in ("token", "sequence")
] + [pytest.param(dict(loss_type="bnpo", beta=0.0, importance_sampling_level="token", delta=1.5,
                       epsilon_high=0.28), id="bnpo-delta")]


@pytest.mark.parametrize("options", MATCHED)
def test_grpo_trainer_matches_trl(model_dir: Path, tmp_path: Path, options: dict) -> None:
    expected = run_grpo(model_dir, tmp_path / "trl", **options)
    with rlk_trl.patched():
        got = run_grpo(model_dir, tmp_path / "rlk", **options)
    assert not rlk_trl.is_patched()
    assert_runs_match(expected, got)
    # the runs moved the policy: a ratio away from 1 is what the clip terms are about
    assert any(entry["clip_ratio/region_mean"] > 0 for entry in expected["logs"])
    logged = {key for key in LOGGED if key in got["logs"][0]}
    sequence_level = options["importance_sampling_level"] == "sequence"
    dropped = {"clip_ratio/region_mean"} if sequence_level else set()
    assert logged == {key for key in LOGGED if key in expected["logs"][0]} - dropped


REFUSED = [
    pytest.param(dict(loss_type="dapo"), "loss_type='dapo'", id="dapo"),
    pytest.param(dict(loss_type="dr_grpo"), "loss_type='dr_grpo'", id="dr_grpo"),
    pytest.param(dict(loss_type="cispo"), "loss_type='cispo'", id="cispo"),
    pytest.param(dict(loss_type="sapo"), "loss_type='sapo'", id="sapo"),
    pytest.param(dict(loss_type="vespo"), "loss_type='vespo'", id="vespo"),
    pytest.param(dict(loss_type="grpo", beta=0.04), "use_bias_correction_kl",
                 id="bias-corrected-kl"),
    pytest.param(dict(loss_type="grpo", mask_truncated_completions=True), "masked completions",
                 id="grpo-masked-truncated"),
    pytest.param(dict(loss_type="bnpo", top_entropy_quantile=0.5), "top_entropy_quantile",
                 id="top-entropy-quantile"),
    pytest.param(dict(loss_type="bnpo", delta=1.1), "delta=1.1", id="delta-below-clip"),
    pytest.param(dict(loss_type="bnpo", entropy_coef=0.01), "entropy_coef=0.01",
                 id="entropy-bonus"),
]


@pytest.mark.parametrize(("options", "message"), REFUSED)
def test_unsupported_options_raise(model_dir: Path, tmp_path: Path, options: dict,
                                   message: str) -> None:
    with rlk_trl.patched(), pytest.raises(UnsupportedOptionError, match=message):
        run_grpo(model_dir, tmp_path, max_steps=1, **options)
