"""Host overhead of the small public ops (policy_loss, group_advantages, logp, entropy,
sample), measured on the CPU.

The GPU work of these ops takes microseconds; what a trainer pays is the Python between the
call and the kernel: validation, dispatch, autograd. This script registers a `null` backend
whose kernels return their outputs at once (allocated, or preallocated), so the time per call
is that overhead alone, at the shapes of the H200 figures (B=64 T=4096; N=8192 rewards in
groups of 16; logp rows of a [4, 2048, V] batch, V kept at 16: the null kernels never read
the logits). Its sample kernel calls rlk.backend.drawn_logp, as rlk-flashinfer's does.
Rows marked "native" run the built-in kernels on tiny shapes ([4, 16] logits), where their
work is a few microseconds. Each row is the median of many calls on the host clock.
  python benchmarks/cpu/small_ops_overhead.py [--reps N] [--profile {policy_loss,logp,sample}]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import rlk
from rlk.backend import drawn_logp
from rlk.dispatch import get_dispatcher
from rlk.ops.policy_loss.op import METRICS

B, T, N, GROUP = 64, 4096, 8192, 16
LEAD, VOCAB, SAMPLED = (4, 2048), 16, 64
_OUT: dict[str, torch.Tensor] = {}


def null_policy_loss(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The outputs of a policy_loss kernel, already computed."""
    return _OUT["loss"], _OUT["metrics"]


def null_policy_loss_backward(*args: Any, **kwargs: Any) -> torch.Tensor:
    return _OUT["grad"]


def null_group_advantages(*args: Any, **kwargs: Any) -> torch.Tensor:
    return _OUT["advantages"]


def null_logp(logits: torch.Tensor, tokens: torch.Tensor, temperature: Any, ignore_index: int,
              rows: Any, out: Any, with_entropy: bool) -> tuple[torch.Tensor, ...]:
    count = logits.shape[0]
    return (torch.empty(count), torch.empty(count) if with_entropy else None,
            torch.empty(count, dtype=torch.float64))


def null_logp_backward(grad_logp: torch.Tensor, grad_entropy: Any, logits: torch.Tensor,
                       *args: Any) -> torch.Tensor:
    return torch.empty_like(logits)


def null_entropy(logits: torch.Tensor, **_: Any) -> tuple[torch.Tensor, torch.Tensor]:
    count = logits.shape[0]
    return torch.empty(count), torch.empty(count, dtype=torch.float64)


def null_entropy_backward(grad_entropy: torch.Tensor, logits: torch.Tensor,
                          *args: Any) -> torch.Tensor:
    return torch.empty_like(logits)


def null_sample(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
                min_p: float, seeds: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A sampler without a logp kernel of its own (rlk-flashinfer's layout)."""
    tokens = _OUT["tokens"]
    logp = drawn_logp(logits, tokens, temperature)
    return tokens, logp, logp.clone()


def register_null_backend() -> None:
    """A backend above every other, serving the ops on the CPU with the kernels above."""
    registry = get_dispatcher().registry
    get_dispatcher().loader.ensure_loaded()
    registry.add_backend("null", priority=10_000)
    registry.add_kernel("policy_loss", "null", "__main__:null_policy_loss",
                        backward="__main__:null_policy_loss_backward", devices=("cpu",))
    registry.add_kernel("group_advantages", "null", "__main__:null_group_advantages",
                        devices=("cpu",))
    for op in ("logp", "logp_entropy"):
        registry.add_kernel(op, "null", "__main__:null_logp",
                            backward="__main__:null_logp_backward", devices=("cpu",))
    registry.add_kernel("entropy", "null", "__main__:null_entropy",
                        backward="__main__:null_entropy_backward", devices=("cpu",))
    registry.add_kernel("sample", "null", "__main__:null_sample", devices=("cpu",))


def median_ms(call: Callable[[], object], reps: int) -> float:
    for _ in range(20):
        call()
    times = []
    for _ in range(reps):
        began = time.perf_counter()
        call()
        times.append((time.perf_counter() - began) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--profile", choices=("policy_loss", "logp", "sample"),
                        help="cProfile one row (fwd+bwd; sample: null), by own time")
    options = parser.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    logp = -torch.rand(B, T, generator=gen) * 3
    old = logp + 0.2 * torch.randn(B, T, generator=gen)
    adv = torch.randn(B, generator=gen)
    mask = torch.rand(B, T, generator=gen) > 0.2
    rewards = torch.randn(N, generator=gen)
    _OUT.update(loss=torch.zeros(()), metrics=torch.zeros(len(METRICS)), grad=torch.zeros(B, T),
                advantages=torch.zeros(N), tokens=torch.zeros(SAMPLED, dtype=torch.int64))
    leaf = logp.clone().requires_grad_(True)
    logits = torch.randn(*LEAD, VOCAB, generator=gen, dtype=torch.bfloat16, requires_grad=True)
    tokens = torch.randint(0, VOCAB, LEAD, generator=gen)
    upstream = torch.ones(LEAD)
    to_sample = torch.randn(SAMPLED, VOCAB, generator=gen)
    seeds = torch.arange(SAMPLED)
    small = torch.randn(4, VOCAB, generator=gen, requires_grad=True)
    small_tokens = torch.randint(0, VOCAB, (4,), generator=gen)

    def grad(output: torch.Tensor, leaf: torch.Tensor) -> object:
        return torch.autograd.grad(output, leaf, torch.ones_like(output))

    null = {
        "rlk.policy_loss fwd": lambda: rlk.policy_loss(logp, old, adv, mask),
        "rlk.policy_loss fwd+bwd":
            lambda: torch.autograd.grad(rlk.policy_loss(leaf, old, adv, mask)[0], leaf),
        "rlk.group_advantages": lambda: rlk.group_advantages(rewards, group_size=GROUP),
        "rlk.logp fwd (no grad)": lambda: rlk.logp(logits.detach(), tokens),
        "rlk.logp fwd+bwd":
            lambda: torch.autograd.grad(rlk.logp(logits, tokens), logits, upstream),
        "rlk.logp_entropy fwd+bwd":
            lambda: torch.autograd.grad(rlk.logp_entropy(logits, tokens), logits,
                                        (upstream, upstream)),
        "rlk.entropy fwd+bwd":
            lambda: torch.autograd.grad(rlk.entropy(logits), logits, upstream),
        "rlk.sample (seeds given)": lambda: rlk.sample(to_sample, seed=seeds),
    }
    native = {
        "native rlk.logp fwd+bwd": lambda: grad(rlk.logp(small, small_tokens), small),
        "native rlk.entropy fwd+bwd": lambda: grad(rlk.entropy(small), small),
        "native rlk.sample (seeds given)": lambda: rlk.sample(small.detach(), seed=seeds[:4]),
        "native rlk.sample top_k top_p":
            lambda: rlk.sample(small.detach(), seed=seeds[:4], top_k=5, top_p=0.9),
    }
    with rlk.use_backends("native"):  # its own selection cache keys: the null rows' stay apart
        for name, call in native.items():
            print(f"{name:34s} {median_ms(call, options.reps):.4f} ms")
    register_null_backend()
    for name, call in null.items():
        print(f"{name:34s} {median_ms(call, options.reps):.4f} ms")
    bare = torch.ones((), requires_grad=True)
    print(f"{'autograd.grad of 2 * x (floor)':34s} "
          f"{median_ms(lambda: torch.autograd.grad(bare * 2, bare), options.reps):.4f} ms")
    if options.profile:
        profiled = {"policy_loss": null["rlk.policy_loss fwd+bwd"],
                    "logp": null["rlk.logp fwd+bwd"],
                    "sample": null["rlk.sample (seeds given)"]}[options.profile]
        profiler = cProfile.Profile()
        profiler.runcall(lambda: [profiled() for _ in range(500)])
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
