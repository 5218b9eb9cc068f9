"""examples/grpo_single_gpu.py as a newcomer runs it: it learns, it is reproducible, and
--require-fused-logp refuses the PyTorch fallback with the dispatcher's reasons."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

import rlk

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "grpo_single_gpu.py"
# the default set-up, cut short: it learns the answer format and part of the digit table
SHORT_RUN = ["--device", "cpu", "--seed", "0", "--steps", "120", "--log-every", "10"]


def run_example(*args: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """The script in its own process. One torch thread: a model this small gains little from
    more, and on a busy CI machine spinning OpenMP threads can slow it tenfold."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=env, check=False)


@pytest.fixture(scope="module")
def example() -> ModuleType:
    """The script imported as a module, for its task and model pieces."""
    spec = importlib.util.spec_from_file_location("grpo_single_gpu_example", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def one_thread() -> Iterator[None]:
    """In-process runs on one torch thread, as run_example's (see there)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_short_run_learns(fresh_rlk, tmp_path):
    metrics = tmp_path / "metrics.json"
    result = run_example(*SHORT_RUN, "--metrics", metrics)
    assert result.returncode == 0, result.stderr
    report = json.loads(metrics.read_text())
    steps, summary = report["steps"], report["summary"]
    assert [s["step"] for s in steps] == list(range(1, 121))
    for name in ("reward", "exact", "kl", "clip_fraction", "ratio", "loss", "seconds"):
        values = torch.tensor([s[name] for s in steps])
        assert torch.isfinite(values).all(), name
    # a real rise, not noise: the mean of the last steps beats the first ones by a margin
    assert summary["reward_last"] > summary["reward_first"] + 0.25, summary
    assert summary["reward_last"] > 0.6, summary
    # greedy answers beyond the format: a right format with a random ones digit scores 0.1
    assert summary["greedy_accuracy_before"] < 0.05, summary
    assert summary["greedy_accuracy_after"] >= 0.2, summary
    assert all(s["kl"] >= 0 for s in steps)  # k3 is non-negative
    assert summary["backends"] == {"sample": "native", "group_advantages": "native",
                                   "linear_logp": "native", "policy_loss": "native"}
    assert "backends: sample=native" in result.stdout
    assert "step  120  reward" in result.stdout and "summary: 120 steps" in result.stdout


def test_same_seed_same_run(fresh_rlk, one_thread, example, tmp_path, capsys):
    def steps(seed: int, name: str) -> list[dict[str, float]]:
        path = tmp_path / f"{name}.json"
        assert example.main(["--device", "cpu", "--seed", str(seed), "--steps", "3",
                             "--metrics", str(path)]) == 0
        return [{k: v for k, v in s.items() if k != "seconds"}
                for s in json.loads(path.read_text())["steps"]]

    first = steps(3, "one")
    assert steps(3, "two") == first
    assert steps(4, "other")[0]["reward"] != first[0]["reward"]
    assert capsys.readouterr().out.count("summary: 3 steps") == 3


def test_require_fused_logp_fails_on_cpu_with_reasons(fresh_rlk, example):
    result = run_example("--device", "cpu", "--steps", "2", "--require-fused-logp")
    assert result.returncode == 1
    assert "step " not in result.stdout  # refused before training
    message = result.stderr
    assert "--require-fused-logp" in message
    assert "would run on the 'native' backend (rlk's PyTorch fallback)" in message
    # every reason the dispatcher gives for this call appears, backend by backend
    hidden = torch.randn(3, 4, 8)
    weight = torch.randn(example.VOCAB, 8)
    tokens = torch.randint(0, example.VOCAB, (3, 4))
    with rlk.use_backends("cuda", "rocm", strict=True):
        selection = rlk.explain("linear_logp", hidden, weight, tokens)
    assert selection.backend is None
    assert {"cuda", "rocm", "native"} <= set(selection.rejected)
    for name, reason in selection.rejected.items():
        assert f"  {name}: {reason}" in message


def test_usage_errors(fresh_rlk, example, capsys):
    with pytest.raises(SystemExit) as exit_info:
        example.main(["--group-size", "1"])
    assert exit_info.value.code == 2
    message = capsys.readouterr().err
    assert "--group-size must be >= 2" in message and "got 1" in message


def test_plot(fresh_rlk, one_thread, example, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "curve.png"
    assert example.main(["--device", "cpu", "--steps", "2", "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _python_reward(answer: list[int], target: list[int], end: int) -> float:
    """The reward rule written out on Python lists, independently of the tensor code."""
    produced = answer[: answer.index(end) + 1] if end in answer else answer
    wanted = target[: target.index(end) + 1]
    hits = sum(a == b for a, b in zip(produced, wanted, strict=False))
    return hits / max(len(produced), len(wanted))


@pytest.mark.parametrize("digits", [1, 2])
def test_reward_matches_python_rule(example, digits):
    task = example.AdditionTask(digits)
    gen = torch.Generator().manual_seed(digits)
    batch = task.batch(300, gen)
    answers = torch.randint(0, example.VOCAB, (300, task.answer_len), generator=gen)
    answers[:100] = batch.targets[:100].clamp(min=0)  # exact answers (IGNORE padding -> 0)
    answers[100:150, 0] = example.END  # empty answers
    reward, exact = task.score(answers, batch.targets)
    want = torch.tensor([_python_reward(a, t, example.END)
                         for a, t in zip(answers.tolist(), batch.targets.tolist(), strict=True)])
    torch.testing.assert_close(reward, want.float())
    assert bool(exact[:100].all()) and not bool(exact[100:150].any())
    assert torch.equal(exact, want == 1.0)


def test_targets_spell_the_sum(example):
    task = example.AdditionTask(2)
    batch = task.batch(50, torch.Generator().manual_seed(5))
    for prompt, target in zip(batch.prompts.tolist(), batch.targets.tolist(), strict=True):
        text = "".join(example.SYMBOLS[t] for t in prompt)
        left, right = text.rstrip("=").split("+")
        answer = "".join(example.SYMBOLS[t] for t in target if t != example.IGNORE)
        assert answer == f"{int(left) + int(right):03d}."


def test_mask_covers_answer_through_end(example):
    end = example.END
    answers = torch.tensor([[1, 2, end], [end, 3, 4], [5, 6, 7], [0, end, end]])
    expected = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 0]], dtype=torch.float32)
    assert torch.equal(example.answer_mask(answers), expected)
