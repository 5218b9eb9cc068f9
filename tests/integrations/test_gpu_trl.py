"""Patched TRL on the GPU in bf16: TRL's GRPOTrainer as is and patched on identical
completions, each judged by float32 and by TRL's own loss in float64.

A random Qwen2.5-0.5B-shaped model (V = 151936, 4 of its 24 layers, untied head so that
the head's gradient is the head's alone) trains STEPS steps as TRL trains by default on a
GPU: float32 parameters, bf16 autocast, gradient checkpointing, a reference model (beta
0.04); generation is replaced by fixed completions. Every patched or judging step starts
from the parameters TRL's run had at that step. Judges:

- float32: the same run with bf16=False (TRL's own code);
- same operands: TRL's loss in float64 with the LM head in float64 from the operands as
  autocast rounds them, over the same bf16 backbone (what rlk replaces, exactly).

Patched must be at least as close as TRL to the same-operands judge on the loss, KL,
entropy and the head's and final norm's gradients, per step, and to the float32 judge on
the head's gradient; the whole table (loss, KL, gradient norm, every parameter's
gradient) is printed. One command on the GPU machine:

    RLK_INTEGRATIONS=1 python -m pytest tests/integrations/test_gpu_trl.py -q -s
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from rlk.integrations import trl as rlk_trl

from .conftest import require
from .test_trl_bf16 import Float64Head, assert_patched_at_least_as_close, distances, grad_error
from .trainer_steps import StepRecorder, step_logs

pytestmark = pytest.mark.gpu

trl = require("trl")
trl_utils = require("trl.trainer.utils")
datasets = require("datasets")
trl_grpo = pytest.importorskip("rlk.bench.workloads.trl_grpo")

STEPS = 3
LENGTH = 256
CASES = {
    "dapo-kl": dict(loss_type="dapo", beta=0.04),  # TRL's defaults: the head, then the loss
    "grpo-kl-iterations2": dict(loss_type="grpo", beta=0.04, num_iterations=2),  # fused
}


def run(model_dir: Path, output_dir: Path, start_from: StepRecorder | None = None,
        bf16: bool = True, **options: Any) -> dict[str, Any]:
    recorder = StepRecorder(start_from)
    settings: dict[str, Any] = dict(
        output_dir=str(output_dir), per_device_train_batch_size=8, gradient_accumulation_steps=2,
        num_generations=4, max_completion_length=LENGTH, max_steps=STEPS, learning_rate=1e-5,
        lr_scheduler_type="constant", logging_steps=1, report_to=[], seed=7,
        save_strategy="no", disable_tqdm=True, bf16=bf16, gradient_checkpointing=True,
        use_cpu=not torch.cuda.is_available(), **options)
    trainer = trl.GRPOTrainer(
        model=str(model_dir), reward_funcs=trl_grpo.token_reward, args=trl.GRPOConfig(**settings),
        train_dataset=datasets.Dataset.from_dict({"prompt": ["-"] * 32}), callbacks=[recorder],
        rollout_func=trl_grpo.FixedCompletions(trl_grpo.VOCAB, LENGTH, seed=3))
    trainer.train()
    return {"logs": step_logs(trainer), "grads": recorder.grads, "recorder": recorder}


def print_table(case: str, judge: str, rows: list[dict[str, Any]]) -> None:
    for step, row in enumerate(rows):
        cells = "  ".join(f"{key} {row.get(('trl', key), float('nan')):.2e}/"
                          f"{row.get(('rlk', key), float('nan')):.2e}"
                          for key in ("loss", "kl", "entropy", "head", "norm", "all"))
        print(f"{case} vs {judge} step {step} (TRL/rlk): {cells}")


@pytest.mark.parametrize("case", list(CASES))
def test_patched_bf16_on_the_gpu_against_float32_and_float64(
        case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    options = CASES[case]
    model_dir = trl_grpo.save_model("qwen2.5-0.5b", tmp_path / "model", num_hidden_layers=4,
                                    tie_word_embeddings=False)
    bf16 = {"trl": run(model_dir, tmp_path / "trl", **options)}
    start = bf16["trl"]["recorder"]
    with rlk_trl.patched():
        bf16["rlk"] = run(model_dir, tmp_path / "rlk", start, **options)
    float32 = run(model_dir, tmp_path / "f32", start, bf16=False, **options)
    with monkeypatch.context() as patch:
        patch.setattr(trl_utils, "_ChunkedLogProbFunction", Float64Head)
        same_operands = run(model_dir, tmp_path / "f64", start, **options)
    judged = {"float32": distances(bf16, float32), "same-operands": distances(bf16, same_operands)}
    for judge, rows in judged.items():
        print_table(case, judge, rows)
    for step in range(STEPS):
        norms = {who: abs(bf16[who]["logs"][step]["grad_norm"] - float32["logs"][step]["grad_norm"])
                 for who in bf16}
        worst = {who: max(grad_error(bf16[who]["grads"][step], float32["grads"][step], (name,))
                          for name in float32["grads"][step]) for who in bf16}
        print(f"{case} vs float32 step {step} (TRL/rlk): grad_norm {norms['trl']:.2e}/"
              f"{norms['rlk']:.2e}  worst parameter {worst['trl']:.2e}/{worst['rlk']:.2e}")
    assert_patched_at_least_as_close(judged["same-operands"], judged["float32"])
