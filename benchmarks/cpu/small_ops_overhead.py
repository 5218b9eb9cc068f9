"""Host overhead of the small public ops (policy_loss, group_advantages), measured on the CPU.

The GPU work of these ops takes microseconds; what a trainer pays is the Python between the
call and the kernel: validation, dispatch, autograd. This script registers a `null` backend
whose kernels return preallocated outputs at once, so the time per call is that overhead
alone, at the shapes of the H200 figures (B=64 T=4096; N=8192 rewards in groups of 16).
Each row is the median of many calls on the host clock, as rlk.bench.timing does on CPU.
  python benchmarks/cpu/small_ops_overhead.py [--reps N] [--profile]
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
from rlk.dispatch import get_dispatcher
from rlk.ops.policy_loss import METRICS

B, T, N, GROUP = 64, 4096, 8192, 16
_OUT: dict[str, torch.Tensor] = {}


def null_policy_loss(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The outputs of a policy_loss kernel, already computed."""
    return _OUT["loss"], _OUT["metrics"]


def null_policy_loss_backward(*args: Any, **kwargs: Any) -> torch.Tensor:
    return _OUT["grad"]


def null_group_advantages(*args: Any, **kwargs: Any) -> torch.Tensor:
    return _OUT["advantages"]


def register_null_backend() -> None:
    """A backend above every other, serving the two ops on the CPU with the kernels above."""
    registry = get_dispatcher().registry
    get_dispatcher().loader.ensure_loaded()
    registry.add_backend("null", priority=10_000)
    registry.add_kernel("policy_loss", "null", "__main__:null_policy_loss",
                        backward="__main__:null_policy_loss_backward", devices=("cpu",))
    registry.add_kernel("group_advantages", "null", "__main__:null_group_advantages",
                        devices=("cpu",))


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
    parser.add_argument("--profile", action="store_true",
                        help="cProfile policy_loss forward+backward, by own time")
    options = parser.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    logp = -torch.rand(B, T, generator=gen) * 3
    old = logp + 0.2 * torch.randn(B, T, generator=gen)
    adv = torch.randn(B, generator=gen)
    mask = torch.rand(B, T, generator=gen) > 0.2
    rewards = torch.randn(N, generator=gen)
    _OUT.update(loss=torch.zeros(()), metrics=torch.zeros(len(METRICS)), grad=torch.zeros(B, T),
                advantages=torch.zeros(N))
    register_null_backend()
    leaf = logp.clone().requires_grad_(True)

    def forward_backward() -> object:
        return torch.autograd.grad(rlk.policy_loss(leaf, old, adv, mask)[0], leaf)

    rows = {
        "rlk.policy_loss fwd": lambda: rlk.policy_loss(logp, old, adv, mask),
        "rlk.policy_loss fwd+bwd": forward_backward,
        "rlk.group_advantages": lambda: rlk.group_advantages(rewards, group_size=GROUP),
    }
    for name, call in rows.items():
        print(f"{name:32s} {median_ms(call, options.reps):.4f} ms")
    bare = torch.ones((), requires_grad=True)
    print(f"{'autograd.grad of 2 * x (floor)':32s} "
          f"{median_ms(lambda: torch.autograd.grad(bare * 2, bare), options.reps):.4f} ms")
    if options.profile:
        profiler = cProfile.Profile()
        profiler.runcall(lambda: [forward_backward() for _ in range(500)])
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
