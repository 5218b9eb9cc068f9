"""TRL's default precision (bf16 autocast over float32 parameters) against float64 oracles.

Each case trains a tiny random Qwen2 (untied head, V = 512) for STEPS steps on fixed
completions (rlk.bench.workloads.trl_grpo.FixedCompletions), in bf16 as TRL does by
default: TRL as is, then patched, each patched or oracle step starting from the
parameters TRL's run had at that step. Two oracles run TRL's own loss in float64:

- over the same operands: the bf16 run's backbone, and the LM head in float64 from the
  head's operands as autocast rounds them, so what remains is exactly what rlk replaces
  (the head's logits and gradients, the loss). Against it, patched TRL must be at least as
  close as TRL, per step, on the loss, KL, entropy and the gradients of the head and the
  final norm (their backward is the head's alone); up to float32's resolution of the
  value (F32), where both are as close as float32 can be.
- the float64 model: the whole model in float64. The backbone's bf16 rounding dominates
  there and is the same in both runs, so both are about equally far; the test records
  the distances (docs/integrations/trl.md's table, `python
  tests/integrations/test_trl_bf16.py`) and holds patched to TRL's distance on the head's
  gradient, within BACKBONE_SLACK.
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from rlk.integrations import trl as rlk_trl

if __package__ in (None, ""):  # run as a script: the table of docs/integrations/trl.md
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "integrations"

from .conftest import require
from .trainer_steps import StepRecorder, step_logs

trl = require("trl")
trl_utils = require("trl.trainer.utils")
datasets = require("datasets")
trl_grpo = pytest.importorskip("rlk.bench.workloads.trl_grpo")

STEPS = 4
LENGTH = 8
# the model's random weights: one replayed, one drawn per run (its value in the test id)
SEEDS = [0, random.randrange(1, 10_000)]
F32 = 2.0**-23  # float32's resolution of a value of magnitude 1
# Both heads round the logits gradient to bf16 once before their GEMMs (TRL's from bf16
# logits, rlk's from float32 ones). Where that rounding dominates the head's and final norm's
# gradients (the GPU test's V = 151936), the two distances to the same-operands float64 agree
# to a fraction of a percent either way on the head (H100: 1.66e-3 / 1.67e-3), so patched is
# held to TRL's distance within ROUNDING_SLACK there; on CPU patched is closer by orders of
# magnitude. A distance over n entries of independent roundings is itself known only to about
# 1/sqrt(2n) (2.4% for the final norm's 896): each label's slack adds SPREADS of that (H100:
# the norm 1.64e-3 / 1.61e-3 at one step, 1.65e-3 / 1.66e-3 at another).
ROUNDING_SLACK = 1.02
SPREADS = 3
# Against the float64 model both runs carry the same backbone's bf16 error, which dominates: at
# one random seed patched was 1.7% farther than TRL on the head's gradient (3.70e-3 / 3.64e-3),
# so that judge holds patched to TRL's distance within 10%, not below it.
BACKBONE_SLACK = 1.10
HEAD = ("lm_head.weight",)
NORM = ("model.norm.weight",)
CASES = {
    # the case: grpo, KL with bias correction, two iterations (the fused loss)
    "grpo-kl-iterations2": dict(loss_type="grpo", beta=0.04, num_iterations=2),
    # TRL's defaults with a KL: dapo, one iteration (the head, then rlk.policy_loss)
    "dapo-kl": dict(loss_type="dapo", beta=0.04),
    "sapo-sequence-iterations2": dict(loss_type="sapo", beta=0.0, num_iterations=2,
                                      importance_sampling_level="sequence"),
}


class Float64Head:
    """TRL's fused LM head contract in float64 (logits and their softmax materialised);
    under autocast, from the operands rounded to the autocast dtype, as the GEMM reads
    them (the rounding passes no gradient: autocast's cast back is exact)."""

    @staticmethod
    def apply(hidden, weight, bias, targets, temperature, chunk_size, softcap=None,
              logit_scale=1.0, outputs=()):
        if torch.is_autocast_enabled(hidden.device.type):
            dtype = torch.get_autocast_dtype(hidden.device.type)
            hidden, weight = (x + (x.to(dtype).to(x.dtype) - x).detach() for x in (hidden, weight))
        logits = hidden.double() @ weight.double().T
        if bias is not None:
            logits = logits + bias.double()
        logits = logits * logit_scale
        if softcap is not None:
            logits = softcap * torch.tanh(logits / softcap)
        logps = (logits / temperature).log_softmax(-1)
        logp = logps.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        entropy = -(logps.exp() * logps).sum(-1) if "entropy" in outputs else None
        return logp, entropy, None, None, None


def run(model_dir: Path, output_dir: Path, start_from: StepRecorder | None = None,
        float64: bool = False, **options: Any) -> dict[str, Any]:
    settings: dict[str, Any] = dict(
        output_dir=str(output_dir), per_device_train_batch_size=4, gradient_accumulation_steps=2,
        num_generations=4, max_completion_length=LENGTH, max_steps=STEPS, learning_rate=0.5,
        optim="sgd", lr_scheduler_type="constant", logging_steps=1, report_to=[], use_cpu=True,
        seed=7, save_strategy="no", disable_tqdm=True, bf16=not float64)
    if float64:
        settings["model_init_kwargs"] = {"dtype": torch.float64}
    settings.update(options)
    recorder = StepRecorder(start_from)
    trainer = trl.GRPOTrainer(
        model=str(model_dir), reward_funcs=trl_grpo.token_reward, args=trl.GRPOConfig(**settings),
        train_dataset=datasets.Dataset.from_dict({"prompt": ["-"] * 16}), callbacks=[recorder],
        rollout_func=trl_grpo.FixedCompletions(512, LENGTH, seed=3, prompt_length=6))
    trainer.train()
    return {"logs": step_logs(trainer), "grads": recorder.grads, "recorder": recorder}


def oracle(model_dir: Path, output_dir: Path, start_from: StepRecorder, float64: bool,
           options: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """TRL's own run with its LM head in float64 (and the whole model with `float64`)."""
    with monkeypatch.context() as patch:
        patch.setattr(trl_utils, "_ChunkedLogProbFunction", Float64Head)
        return run(model_dir, output_dir, start_from, float64=float64, **options)


def grad_error(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor],
               names: tuple[str, ...] | None = None) -> float:
    """|got - want| / |want| over the named parameters' gradients (all of them by default)."""
    names = tuple(want) if names is None else names
    num = sum(float((got[n].double() - want[n].double()).square().sum()) for n in names)
    den = sum(float(want[n].double().square().sum()) for n in names)
    return math.sqrt(num / den)


def distances(runs: dict[str, dict[str, Any]], truth: dict[str, Any]) -> list[dict[str, Any]]:
    """Per step, each run's distance from `truth` on the logged values and gradients."""
    rows = []
    for step in range(len(truth["logs"])):
        row: dict[str, Any] = {}
        for name, found in runs.items():
            for key in ("loss", "kl", "entropy"):
                if key in truth["logs"][step]:
                    want = truth["logs"][step][key]
                    row[name, key] = abs(found["logs"][step][key] - want)
                    row["value", key] = want
            for label, names in (("head", HEAD), ("norm", NORM), ("all", None)):
                row[name, label] = grad_error(found["grads"][step], truth["grads"][step], names)
                row["entries", label] = sum(truth["grads"][step][n].numel()
                                            for n in (names or truth["grads"][step]))
        rows.append(row)
    return rows


def assert_patched_at_least_as_close(same_operands: list[dict[str, Any]],
                                     whole_model: list[dict[str, Any]]) -> None:
    """Per step: patched at least as close as TRL to TRL's loss in float64 over the same
    operands on the loss, KL and entropy (up to F32 of the value) and the head's and final
    norm's gradients (within ROUNDING_SLACK and the distances' sampling spread); and about
    as close as TRL to the float64 model on the head's gradient."""
    for step, row in enumerate(same_operands):
        for key in ("loss", "kl", "entropy"):
            if ("trl", key) in row:
                floor = F32 * (1 + abs(row["value", key]))
                assert row["rlk", key] <= row["trl", key] + floor, (step, key, row)
        for label in ("head", "norm"):
            slack = ROUNDING_SLACK + SPREADS / math.sqrt(2 * row["entries", label])
            assert row["rlk", label] <= slack * row["trl", label], (step, label, row)
    for step, row in enumerate(whole_model):
        assert row["rlk", "head"] <= BACKBONE_SLACK * row["trl", "head"], (step, row)


def compare(case: str, workdir: Path, monkeypatch: pytest.MonkeyPatch,
            seed: int = 0) -> dict[str, list]:
    options = CASES[case]
    model_dir = trl_grpo.save_model("tiny", workdir / "model", seed=seed,
                                    tie_word_embeddings=False)
    bf16 = {"trl": run(model_dir, workdir / "trl", **options)}
    start = bf16["trl"]["recorder"]
    with rlk_trl.patched():
        bf16["rlk"] = run(model_dir, workdir / "rlk", start, **options)
    return {
        "same-operands": distances(bf16, oracle(model_dir, workdir / "o1", start, False, options,
                                                monkeypatch)),
        "float64-model": distances(bf16, oracle(model_dir, workdir / "o2", start, True, options,
                                                monkeypatch)),
    }


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("case", list(CASES))
def test_patched_is_at_least_as_close_to_float64_as_trl(case: str, seed: int, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    found = compare(case, tmp_path, monkeypatch, seed)
    assert_patched_at_least_as_close(found["same-operands"], found["float64-model"])


def main() -> int:
    """The distance table of docs/integrations/trl.md."""
    import tempfile

    print("| case | oracle | step | loss TRL / rlk | KL TRL / rlk | head grad TRL / rlk "
          "| all grads TRL / rlk |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as workdir, pytest.MonkeyPatch.context() as patch:
        for case in CASES:
            found = compare(case, Path(workdir) / case, patch)
            for oracle_name, rows in found.items():
                for step, row in enumerate(rows):
                    cells = [" / ".join(f"{row.get((who, key), float('nan')):.1e}"
                                        for who in ("trl", "rlk"))
                             for key in ("loss", "kl", "head", "all")]
                    print(f"| {case} | {oracle_name} | {step} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
