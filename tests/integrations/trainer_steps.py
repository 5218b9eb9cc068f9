"""Step-by-step comparison of two runs of a TRL trainer: logs, parameters, gradients.

A run's `StepRecorder` keeps each step's starting parameters and every gradient before
the optimizer step; a second run given `start_from` loads the first run's parameters at
the start of each step, so each step compares one step's computation.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .conftest import require

transformers = require("transformers")

# logged values that measure the machine, not the computation
TIMING = frozenset({"step_time", "train_runtime", "train_samples_per_second",
                    "train_steps_per_second"})


class StepRecorder(transformers.TrainerCallback):
    """Each step's starting parameters and every gradient before the optimizer step.

    With `start_from` (another run's recorder), each step first loads that run's
    starting parameters for the step: before the step's generation, which follows.
    """

    def __init__(self, start_from: StepRecorder | None = None) -> None:
        self.start_from = start_from
        self.parameters: list[dict[str, torch.Tensor]] = []
        self.grads: list[dict[str, torch.Tensor]] = []

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if self.start_from is not None:
            start = self.start_from.parameters[len(self.parameters)]
            with torch.no_grad():
                for name, parameter in model.named_parameters():
                    parameter.copy_(start[name])
        self.parameters.append({name: p.detach().clone() for name, p in model.named_parameters()})

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads.append({name: p.grad.detach().clone() for name, p in model.named_parameters()
                           if p.grad is not None})


def step_logs(trainer: Any) -> list[dict[str, float]]:
    """The trainer's per-step log entries (the final summary left out)."""
    return [entry for entry in trainer.state.log_history if "train_runtime" not in entry]


def assert_logs_match(expected: list[dict[str, float]], got: list[dict[str, float]],
                      tolerance: float) -> None:
    """Every value TRL logged, at every step, logged alike (NaN where TRL's is NaN)."""
    assert len(got) == len(expected) > 0
    for step, (want, have) in enumerate(zip(expected, got, strict=True)):
        assert set(have) - TIMING == set(want) - TIMING, (step, set(have) ^ set(want))
        for key in set(want) - TIMING:
            assert math.isclose(have[key], want[key], rel_tol=tolerance, abs_tol=tolerance) or (
                math.isnan(have[key]) and math.isnan(want[key])), (step, key, want[key], have[key])


def assert_grads_match(expected: StepRecorder, got: StepRecorder, tolerance: float) -> None:
    """Every parameter's gradient at every step."""
    assert len(got.grads) == len(expected.grads) > 0
    for step, (want, have) in enumerate(zip(expected.grads, got.grads, strict=True)):
        assert want.keys() == have.keys()
        for name in want:
            torch.testing.assert_close(have[name], want[name], rtol=tolerance, atol=tolerance,
                                       msg=lambda m, n=name, s=step: f"step {s} {n}: {m}")
