"""GRPO on a tiny causal language model, every RL step served by rlk's operators.

A newcomer's first run: a small transformer (defined below, randomly initialised,
nothing downloaded) learns single-digit addition ("7+5=" -> "12." where "." ends
the answer) from a verifiable reward computed on the tokens it generates. Each step
draws prompts x group-size rollouts with `rlk.sample`, turns the rewards into
`rlk.group_advantages`, scores the answers with `rlk.linear_logp` (policy, old
policy and a frozen reference, straight from hidden states and the LM-head
weight), and minimises `rlk.policy_loss` (clipped surrogate, KL to the reference,
optional truncated importance sampling) with AdamW.

    python examples/grpo_single_gpu.py                      # CPU unless torch sees a GPU
    python examples/grpo_single_gpu.py --device cuda --require-fused-logp

Walk-through: docs/examples/grpo.md.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

import rlk

IGNORE = -100  # rlk's default ignore_index: positions after the end of an answer

# ---------------------------------------------------------------------------
# the task: "a+b=" -> the decimal digits of a + b, then END


PLUS, EQUALS, END = 10, 11, 12
VOCAB = 13
SYMBOLS = "0123456789+=."


@dataclass(frozen=True)
class Batch:
    """Prompts and the answers a perfect policy gives: the sum's digits, zero-padded, then END."""

    prompts: Tensor  # [B, P] int64
    targets: Tensor  # [B, A] int64


class AdditionTask:
    """Addition of two `digits`-digit numbers; reward is the share of answer positions right.

    "7+5=" -> "12.", "3+4=" -> "07.": a fixed-width answer keeps each digit at one
    position. Partial credit (instead of exact match only) gives a random policy a
    signal from the first step, which is what lets a model trained from scratch learn
    within a few hundred steps.
    """

    def __init__(self, digits: int):
        if digits < 1:
            raise ValueError(f"digits must be >= 1, got {digits}")
        self.digits = digits
        self.prompt_len = 2 * digits + 2
        self.answer_len = digits + 2  # digits + 1 sum digits, then END

    def batch(self, count: int, generator: torch.Generator) -> Batch:
        """`count` random problems."""
        high = 10**self.digits
        left = torch.randint(0, high, (count,), generator=generator)
        right = torch.randint(0, high, (count,), generator=generator)
        return self.encode(left, right)

    def all_problems(self) -> Batch:
        """Every problem once (the evaluation set for one-digit operands)."""
        high = 10**self.digits
        values = torch.arange(high)
        return self.encode(values.repeat_interleave(high), values.repeat(high))

    def encode(self, left: Tensor, right: Tensor) -> Batch:
        prompts = torch.cat([_digits(left, self.digits), _column(PLUS, left),
                             _digits(right, self.digits), _column(EQUALS, left)], dim=1)
        targets = torch.cat([_digits(left + right, self.digits + 1), _column(END, left)], dim=1)
        return Batch(prompts, targets)

    @staticmethod
    def score(answers: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """Reward in [0, 1] per answer, and whether it is exactly right.

        An answer ends at its first END (or at its last token); the reward counts the
        positions up to there that match the target, over the target's length.
        """
        answers, targets = answers.cpu(), targets.cpu()
        inside = torch.arange(answers.shape[1]) < answer_lengths(answers).unsqueeze(1)
        reward = ((answers == targets) & inside).float().mean(dim=1)
        return reward, reward == 1.0

    @staticmethod
    def render(prompt: Tensor, answer: Tensor) -> str:
        """A problem and an answer as text, e.g. "7+5=12."."""
        length = int(answer_lengths(answer.unsqueeze(0))[0])
        return "".join(SYMBOLS[t] for t in prompt.tolist() + answer[:length].tolist())


def _digits(values: Tensor, width: int) -> Tensor:
    """[N] -> [N, width] decimal digits, most significant first, zero-padded."""
    powers = 10 ** torch.arange(width - 1, -1, -1)
    return (values.unsqueeze(1) // powers) % 10


def _column(token: int, like: Tensor) -> Tensor:
    return torch.full((len(like), 1), token, dtype=torch.int64)


def answer_lengths(answers: Tensor) -> Tensor:
    """Tokens up to and including the first END (all of them when there is none)."""
    is_end = answers == END
    return torch.where(is_end.any(dim=1), is_end.int().argmax(dim=1) + 1, answers.shape[1])


def answer_mask(answers: Tensor) -> Tensor:
    """float32 0/1 [B, A]: the tokens an answer consists of (what the loss trains on)."""
    position = torch.arange(answers.shape[1], device=answers.device)
    return (position < answer_lengths(answers).unsqueeze(1)).float()


# ---------------------------------------------------------------------------
# the model: a pre-norm causal transformer that returns hidden states


class Block(nn.Module):
    """Causal self-attention then an MLP, each behind a LayerNorm and a residual."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x: Tensor) -> Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.norm2(x))


class TinyCausalLM(nn.Module):
    """Returns hidden states, not logits: `lm_head.weight` goes to `rlk.linear_logp`."""

    def __init__(self, vocab: int, width: int, layers: int, heads: int, max_len: int):
        super().__init__()
        if width % heads:
            raise ValueError(f"width must be a multiple of heads; got width={width}, "
                             f"heads={heads}")
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Embedding(max_len, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: Tensor) -> Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.position(positions)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


# ---------------------------------------------------------------------------
# rollouts, scoring, the GRPO update


@dataclass(frozen=True)
class Rollout:
    """What one round of sampling produced."""

    sequences: Tensor  # [B, P + A] prompt then sampled answer
    answers: Tensor  # [B, A]
    logp: Tensor  # [B, A] the sampler's log-probabilities (for TIS)


@torch.no_grad()
def generate(model: TinyCausalLM, prompts: Tensor, steps: int, temperature: float,
             seeds: torch.Generator) -> Rollout:
    """Autoregressive sampling with rlk.sample; one int64 seed per row per token."""
    sequences = prompts
    answers, logps = [], []
    for _ in range(steps):
        hidden = model(sequences)[:, -1]
        logits = model.lm_head(hidden)
        row_seeds = torch.randint(0, 2**62, (len(prompts),), generator=seeds)
        tokens, logp, _ = rlk.sample(logits, temperature=temperature,
                                     seed=row_seeds.to(logits.device))
        answers.append(tokens)
        logps.append(logp)
        sequences = torch.cat([sequences, tokens.unsqueeze(1)], dim=1)
    return Rollout(sequences, torch.stack(answers, dim=1), torch.stack(logps, dim=1))


def answer_logp(model: TinyCausalLM, rollout: Rollout, temperature: float,
                fused_only: bool) -> Tensor:
    """log p(answer token | everything before it) [B, A]; 0 after an answer's END."""
    answer_len = rollout.answers.shape[1]
    hidden = model(rollout.sequences[:, :-1])[:, -answer_len:]
    targets = rollout.answers.masked_fill(answer_mask(rollout.answers) == 0, IGNORE)
    with logp_dispatch(fused_only):
        return rlk.linear_logp(hidden, model.lm_head.weight, targets, temperature=temperature)


def logp_dispatch(fused_only: bool) -> contextlib.AbstractContextManager[Any]:
    """--require-fused-logp: only a fused GPU backend may serve log-probs, or raise."""
    if fused_only:
        return rlk.use_backends(*FUSED_BACKENDS, strict=True)
    return contextlib.nullcontext()


FUSED_BACKENDS = ("cuda", "rocm")


@dataclass
class StepMetrics:
    """One step's numbers; policy_loss metrics are means over the step's updates."""

    step: int
    reward: float
    exact: float
    kl: float
    clip_fraction: float
    ratio: float
    truncated: float
    loss: float
    seconds: float


class Trainer:
    """One GRPO step: rollouts, rewards, group advantages, old/ref log-probs, updates."""

    def __init__(self, args: argparse.Namespace, device: torch.device):
        self.args = args
        self.device = device
        self.task = AdditionTask(args.digits)
        max_len = self.task.prompt_len + self.task.answer_len
        self.policy = TinyCausalLM(VOCAB, args.width, args.layers, args.heads, max_len).to(device)
        self.reference = copy.deepcopy(self.policy).requires_grad_(False).eval()
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=args.lr,
                                           weight_decay=args.weight_decay)
        self.problems = torch.Generator().manual_seed(args.seed + 1)
        self.seeds = torch.Generator().manual_seed(args.seed + 2)
        self.shuffle = torch.Generator().manual_seed(args.seed + 3)

    def rollout(self, batch: Batch, temperature: float, seeds: torch.Generator) -> Rollout:
        prompts = batch.prompts.to(self.device)
        return generate(self.policy, prompts, self.task.answer_len, temperature, seeds)

    def step(self, number: int) -> StepMetrics:
        args = self.args
        start = time.perf_counter()
        batch = self.task.batch(args.prompts, self.problems)
        batch = Batch(batch.prompts.repeat_interleave(args.group_size, dim=0),
                      batch.targets.repeat_interleave(args.group_size, dim=0))
        rollout = self.rollout(batch, args.temperature, self.seeds)
        reward, exact = self.task.score(rollout.answers, batch.targets)
        advantages = rlk.group_advantages(reward.to(self.device), group_size=args.group_size,
                                          normalize=args.normalize, baseline=args.baseline)
        with torch.no_grad():
            old = answer_logp(self.policy, rollout, args.temperature, args.require_fused_logp)
            ref = answer_logp(self.reference, rollout, args.temperature,
                              args.require_fused_logp)
        mask = answer_mask(rollout.answers)
        totals: dict[str, float] = {}
        updates = 0
        for rows in self._minibatches(len(reward)):
            part = Rollout(rollout.sequences[rows], rollout.answers[rows], rollout.logp[rows])
            logp = answer_logp(self.policy, part, args.temperature, args.require_fused_logp)
            loss, metrics = rlk.policy_loss(
                logp, old[rows], advantages[rows], mask[rows], ref_logp=ref[rows],
                rollout_logp=part.logp if args.tis_cap is not None else None,
                clip_low=args.clip_low, clip_high=args.clip_high, kl_coef=args.kl_coef,
                kl_estimator=args.kl_estimator, agg=args.agg, tis_cap=args.tis_cap,
            )
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(self.policy.parameters(), args.max_grad_norm)
            self.optimizer.step()
            metrics["loss"] = loss.detach()
            for name, value in metrics.items():
                totals[name] = totals.get(name, 0.0) + float(value)
            updates += 1
        mean = {name: total / updates for name, total in totals.items()}
        return StepMetrics(
            step=number, reward=float(reward.mean()), exact=float(exact.float().mean()),
            kl=mean["mean_kl"], clip_fraction=mean["clip_fraction"], ratio=mean["mean_ratio"],
            truncated=mean["truncated_fraction"], loss=mean["loss"],
            seconds=time.perf_counter() - start,
        )

    def _minibatches(self, count: int) -> Iterator[Tensor]:
        """Every epoch, the batch in `--minibatches` shuffled parts: later parts are off-policy,
        which is what the clipped ratio is for."""
        for _ in range(self.args.epochs):
            order = torch.randperm(count, generator=self.shuffle).to(self.device)
            yield from order.chunk(self.args.minibatches)

    def evaluate(self) -> tuple[float, list[str]]:
        """Greedy (temperature 0) exact-match accuracy on a fixed set of problems, and a
        few of the answers, marked right or wrong."""
        if self.args.digits == 1:
            problems = self.task.all_problems()
        else:
            problems = self.task.batch(500, torch.Generator().manual_seed(self.args.seed + 4))
        rollout = self.rollout(problems, 0.0, torch.Generator().manual_seed(0))
        exact = self.task.score(rollout.answers, problems.targets)[1]
        shown = [f"{self.task.render(problems.prompts[i], rollout.answers[i])} "
                 f"{'right' if exact[i] else 'wrong'}" for i in range(0, len(exact), 23)[:5]]
        return float(exact.float().mean()), shown


# ---------------------------------------------------------------------------
# which backend serves each op, and --require-fused-logp


class FusedLogpUnavailable(RuntimeError):
    """--require-fused-logp was given but log-probs would run on a fallback backend."""


def backend_report(trainer: Trainer) -> dict[str, str]:
    """rlk.explain for every op the step calls, on a batch of the real shapes."""
    args = trainer.args
    device = trainer.device
    weight = trainer.policy.lm_head.weight.detach()
    tokens = trainer.task.batch(2, torch.Generator().manual_seed(0)).targets.to(device)
    hidden = weight.new_zeros(*tokens.shape, weight.shape[1])
    logp = weight.new_zeros(tokens.shape)
    calls: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
        "sample": ((weight.new_zeros(2, VOCAB),), {"temperature": args.temperature}),
        "group_advantages": ((weight.new_zeros(4),),
                             {"group_size": 2, "normalize": args.normalize,
                              "baseline": args.baseline}),
        "linear_logp": ((hidden, weight, tokens), {"temperature": args.temperature}),
        "policy_loss": ((logp, logp, logp[:, 0], logp),
                        {"ref_logp": logp, "agg": args.agg, "kl_estimator": args.kl_estimator,
                         "rollout_logp": None if args.tis_cap is None else logp,
                         "tis_cap": args.tis_cap}),
    }
    served = {op: rlk.explain(op, *a, **kw).backend or "none" for op, (a, kw) in calls.items()}
    if args.require_fused_logp:
        hidden_args, kwargs = calls["linear_logp"]
        with logp_dispatch(True):
            strict = rlk.explain("linear_logp", *hidden_args, **kwargs)
        if strict.backend is None:
            raise FusedLogpUnavailable(_fused_failure(served["linear_logp"], strict.rejected,
                                                      trainer.device))
        served["linear_logp"] = strict.backend
    return served


def _fused_failure(fallback: str, reasons: Mapping[str, str], device: torch.device) -> str:
    what = "rlk's PyTorch fallback" if fallback == "native" else "not a fused GPU backend"
    lines = [f"--require-fused-logp: rlk.linear_logp on {device} would run on the "
             f"'{fallback}' backend ({what}), not on {' or '.join(FUSED_BACKENDS)}. "
             "The dispatcher's reasons:"]
    lines += [f"  {name}: {why}" for name, why in reasons.items()]
    lines.append("Build/install rlk-cuda (or rlk-rocm) on a GPU machine and pass --device cuda, "
                 "or drop --require-fused-logp to accept the fallback.")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# command line, report, plot


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: CUDA when torch sees a GPU, else CPU")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds the model, the problems, the sampler and the shuffles")
    p.add_argument("--steps", type=int, default=400, help="GRPO steps")
    p.add_argument("--prompts", type=int, default=16, help="prompts per step")
    p.add_argument("--group-size", type=int, default=16, help="rollouts per prompt")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping")
    p.add_argument("--epochs", type=int, default=1, help="passes over each step's rollouts")
    p.add_argument("--minibatches", type=int, default=4, help="updates per epoch")
    p.add_argument("--clip-low", type=float, default=0.2, help="ratio floor: 1 - clip_low")
    p.add_argument("--clip-high", type=float, default=0.28,
                   help="ratio ceiling: 1 + clip_high (DAPO's clip-higher)")
    p.add_argument("--kl-coef", type=float, default=0.05, help="KL penalty to the reference")
    p.add_argument("--kl-estimator", choices=("k1", "k2", "k3"), default="k3",
                   help="estimator of the per-token KL to the reference")
    p.add_argument("--agg", default="token-mean", help="how token losses are averaged",
                   choices=("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                            "seq-mean-token-sum-norm"))
    p.add_argument("--normalize", choices=("std", "none"), default="std",
                   help="divide advantages by the group std (none: Dr. GRPO)")
    p.add_argument("--baseline", choices=("mean", "loo"), default="mean",
                   help="group mean, or leave-one-out mean (RLOO)")
    p.add_argument("--tis-cap", type=float, default=None,
                   help="truncated importance sampling against the sampler's log-probs, "
                        "weights capped at this value (off when not given)")
    p.add_argument("--digits", type=int, default=1, help="digits per operand")
    p.add_argument("--width", type=int, default=64, help="model hidden size")
    p.add_argument("--layers", type=int, default=2, help="transformer blocks")
    p.add_argument("--heads", type=int, default=4, help="attention heads")
    p.add_argument("--log-every", type=int, default=1, help="print every N steps")
    p.add_argument("--metrics", type=Path, default=None,
                   help="write per-step metrics and the summary as JSON here")
    p.add_argument("--plot", type=Path, default=None,
                   help="save a PNG of reward and KL per step (needs matplotlib)")
    p.add_argument("--require-fused-logp", action="store_true",
                   help="fail unless linear_logp runs on a fused GPU backend (cuda, rocm)")
    args = p.parse_args(argv)
    for name in ("steps", "prompts", "group_size", "epochs", "minibatches", "log_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.group_size < 2:
        p.error(f"--group-size must be >= 2 (advantages compare rollouts of one prompt), "
                f"got {args.group_size}")
    if args.minibatches > args.prompts * args.group_size:
        p.error(f"--minibatches ({args.minibatches}) exceeds the rollouts per step "
                f"({args.prompts * args.group_size})")
    if args.plot is not None and _pyplot() is None:
        p.error("--plot needs matplotlib (pip install matplotlib)")
    return args


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device "
                         f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})")
    return torch.device(name)


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save_plot(history: list[StepMetrics], path: Path) -> None:
    plt = _pyplot()
    steps = [m.step for m in history]
    figure, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(7, 5))
    top.plot(steps, [m.reward for m in history], label="mean reward")
    top.plot(steps, [m.exact for m in history], label="exact answers")
    top.set_ylim(0, 1)
    top.set_title("GRPO on toy addition (rlk)")
    top.legend(loc="lower right")
    bottom.plot(steps, [m.kl for m in history], color="tab:red")
    bottom.set_ylabel("KL to reference")
    bottom.set_xlabel("step")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _print_step(m: StepMetrics, tis: bool) -> None:
    truncated = f"  truncated {m.truncated:.3f}" if tis else ""
    print(f"step {m.step:4d}  reward {m.reward:.3f}  exact {m.exact:.3f}  kl {m.kl:.4f}  "
          f"clip {m.clip_fraction:.3f}  ratio {m.ratio:.3f}{truncated}  "
          f"time {m.seconds * 1e3:6.1f} ms", flush=True)


def summarise(history: list[StepMetrics], before: float, after: float,
              seconds: float) -> dict[str, Any]:
    """Mean reward over the first and last steps (a tenth of the run, at most 10 steps)."""
    window = max(1, min(10, len(history) // 10))
    return {
        "steps": len(history),
        "window": window,
        "reward_first": sum(m.reward for m in history[:window]) / window,
        "reward_last": sum(m.reward for m in history[-window:]) / window,
        "greedy_accuracy_before": before,
        "greedy_accuracy_after": after,
        "kl_last": history[-1].kl,
        "seconds": seconds,
    }


def train(args: argparse.Namespace, device: torch.device,
          on_step: Callable[[StepMetrics], None]) -> tuple[list[StepMetrics], dict[str, Any]]:
    torch.manual_seed(args.seed)
    trainer = Trainer(args, device)
    served = backend_report(trainer)
    print("backends: " + ", ".join(f"{op}={name}" for op, name in served.items()), flush=True)
    before, _ = trainer.evaluate()
    start = time.perf_counter()
    history = []
    for number in range(1, args.steps + 1):
        metrics = trainer.step(number)
        history.append(metrics)
        on_step(metrics)
    seconds = time.perf_counter() - start
    after, answers = trainer.evaluate()
    summary = summarise(history, before, after, seconds)
    summary.update(backends=served, answers=answers)
    return history, summary


def print_summary(summary: dict[str, Any]) -> None:
    steps, window = summary["steps"], summary["window"]
    print(f"summary: {steps} steps in {summary['seconds']:.1f} s "
          f"({summary['seconds'] / steps:.2f} s/step)")
    print(f"  mean reward      {summary['reward_first']:.3f} (first {window} steps) -> "
          f"{summary['reward_last']:.3f} (last {window})")
    print(f"  greedy accuracy  {summary['greedy_accuracy_before']:.3f} -> "
          f"{summary['greedy_accuracy_after']:.3f} (exact answers, temperature 0)")
    print(f"  KL to reference  {summary['kl_last']:.4f} (last step)")
    print("  answers          " + ", ".join(summary["answers"]))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    device = resolve_device(args.device)
    print(f"GRPO on {device}: {args.steps} steps x {args.prompts} prompts x "
          f"{args.group_size} rollouts, torch {torch.__version__}, rlk {rlk.__version__}",
          flush=True)

    def on_step(m: StepMetrics) -> None:
        if m.step % args.log_every == 0 or m.step == args.steps:
            _print_step(m, args.tis_cap is not None)

    try:
        history, summary = train(args, device, on_step)
    except (FusedLogpUnavailable, rlk.BackendUnavailableError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print_summary(summary)
    if args.metrics is not None:
        payload = {"args": {k: str(v) if isinstance(v, Path) else v
                            for k, v in vars(args).items()},
                   "steps": [vars(m) for m in history], "summary": summary}
        args.metrics.write_text(json.dumps(payload, indent=1))
    if args.plot is not None:
        save_plot(history, args.plot)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
