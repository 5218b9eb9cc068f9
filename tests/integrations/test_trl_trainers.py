"""TRL's other trainers under `patch()`: SFT, DPO, KTO and RLOO train as TRL trains them.

`patch()` is process-wide, and TRL's trainers share the fused LM head. Each trainer runs a
tiny random Qwen2 for a few steps on CPU in float32, once with TRL's own code and once
patched (each patched step from the parameters TRL's run had at that step); every logged
value and every parameter gradient must agree. The heads that ask for more than
log-probs and entropy (SFT's `is_top1`; DPO's and KTO's `mean_logits`) run TRL's own
function; the reference models' heads and RLOO's run rlk.linear_logp(_entropy).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import rlk
from rlk.integrations import trl as rlk_trl

from .conftest import example, require
from .trainer_steps import StepRecorder, assert_grads_match, assert_logs_match, step_logs

trl = require("trl")
trl_kernels = require("trl.kernels")
datasets = require("datasets")

TOLERANCE = 1e-5
STEPS = 3
PROBLEMS = ["1+2=", "3+4=", "5+5=", "9+1=", "2+7=", "8+8=", "4+4=", "6+1="]
ANSWERS = [f"{sum(map(int, problem[:-1].split('+')))}." for problem in PROBLEMS]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return example().save_tiny_qwen2(tmp_path_factory.mktemp("tiny-qwen2"))


def length_reward(completions: list[str], **_: Any) -> list[float]:
    return [float(len(text)) for text in completions]


def build(name: str, model_dir: Path, output_dir: Path, recorder: StepRecorder,
          **options: Any) -> Any:
    """A TRL trainer on the tiny model: SGD, one example batch of 4, STEPS steps."""
    common = dict(output_dir=str(output_dir), per_device_train_batch_size=4, max_steps=STEPS,
                  learning_rate=0.5, optim="sgd", lr_scheduler_type="constant",
                  logging_steps=1, report_to=[], use_cpu=True, seed=7, save_strategy="no",
                  disable_tqdm=True, bf16=False)
    common.update(options)
    train = dict(model=str(model_dir), callbacks=[recorder])
    if name == "sft":
        data = {"text": [p + a for p, a in zip(PROBLEMS, ANSWERS, strict=True)]}
        return trl.SFTTrainer(args=trl.SFTConfig(max_length=16, **common),
                              train_dataset=datasets.Dataset.from_dict(data), **train)
    if name == "dpo":
        data = {"prompt": PROBLEMS, "chosen": ANSWERS, "rejected": ["0." for _ in PROBLEMS]}
        return trl.DPOTrainer(args=trl.DPOConfig(max_length=16, **common),
                              train_dataset=datasets.Dataset.from_dict(data), **train)
    if name == "kto":
        data = {"prompt": PROBLEMS,
                "completion": [a if i % 2 else "0." for i, a in enumerate(ANSWERS)],
                "label": [bool(i % 2) for i in range(len(PROBLEMS))]}
        return trl.KTOTrainer(args=trl.KTOConfig(max_length=16, **common),
                              train_dataset=datasets.Dataset.from_dict(data), **train)
    assert name == "rloo"
    return trl.RLOOTrainer(
        reward_funcs=length_reward,
        args=trl.RLOOConfig(num_generations=4, max_completion_length=6, beta=0.04, **common),
        train_dataset=datasets.Dataset.from_dict({"prompt": PROBLEMS}), **train)


def run(name: str, model_dir: Path, output_dir: Path, start_from: StepRecorder | None = None,
        **options: Any) -> dict[str, Any]:
    recorder = StepRecorder(start_from)
    trainer = build(name, model_dir, output_dir, recorder, **options)
    trainer.train()
    return {"logs": step_logs(trainer), "recorder": recorder}


@pytest.fixture
def head_calls(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Counts the fused LM head's calls served by TRL's function and by rlk."""
    calls: Counter = Counter()

    def counting(key: str, function: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            calls[key] += 1
            return function(*args, **kwargs)
        return counted

    monkeypatch.setattr(trl_kernels.ChunkedLogProbFunction, "apply", staticmethod(
        counting("trl", trl_kernels.ChunkedLogProbFunction.apply)))
    for name in ("linear_logp", "linear_logp_entropy"):
        monkeypatch.setattr(rlk, name, counting("rlk", getattr(rlk, name)))
    return calls


# trainer -> (its options, whether TRL's head serves the policy, whether rlk serves a head)
TRAINERS = {
    "sft": ({}, True, False),
    "dpo": ({}, True, True),  # rlk: the reference model
    "dpo-wpo": ({"use_weighting": True}, True, True),  # log_sum_sq_probs
    "kto": ({}, True, True),
    "rloo": ({}, False, True),
}


@pytest.mark.parametrize("case", list(TRAINERS))
def test_trainer_matches_trl_when_patched(model_dir: Path, tmp_path: Path, case: str,
                                          head_calls: Counter) -> None:
    options, trl_head, rlk_head = TRAINERS[case]
    name = case.split("-")[0]
    expected = run(name, model_dir, tmp_path / "trl", **options)
    head_calls.clear()
    with rlk_trl.patched():
        got = run(name, model_dir, tmp_path / "rlk", start_from=expected["recorder"], **options)
    assert len(expected["logs"]) == STEPS
    assert_logs_match(expected["logs"], got["logs"], TOLERANCE)
    assert_grads_match(expected["recorder"], got["recorder"], TOLERANCE)
    assert (head_calls["trl"] > 0) == trl_head, head_calls
    assert (head_calls["rlk"] > 0) == rlk_head, head_calls


def test_sft_then_grpo_under_one_patch(model_dir: Path, tmp_path: Path,
                                       head_calls: Counter) -> None:
    """The documented use: patch at the top of a script that runs SFT, then GRPO."""
    with rlk_trl.patched():
        run("sft", model_dir, tmp_path / "sft", max_steps=1)
        sft_calls = dict(head_calls)
        trainer = trl.GRPOTrainer(
            model=str(model_dir), reward_funcs=length_reward,
            args=trl.GRPOConfig(output_dir=str(tmp_path / "grpo"), per_device_train_batch_size=4,
                                num_generations=4, max_completion_length=6, max_steps=1,
                                report_to=[], use_cpu=True, save_strategy="no",
                                disable_tqdm=True, bf16=False),
            train_dataset=datasets.Dataset.from_dict({"prompt": PROBLEMS}))
        trainer.train()
    assert sft_calls.get("trl", 0) > 0 and sft_calls.get("rlk", 0) == 0
    assert head_calls["rlk"] > 0
    assert trainer.state.global_step == 1
