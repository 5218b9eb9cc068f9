"""Host time against GPU time of the small cuda ops (policy_loss, group_advantages).

Each call is timed on the host (no sync inside the loop) and under torch.profiler for its GPU
time, once through the rlk_cuda kernel functions and once through the public rlk op, at
B=64 T=4096 (policy_loss) and N=8192 rewards in groups of 16 (group_advantages).
`--profile` adds a cProfile of rlk.policy_loss forward+backward, by own time: where the
host time of the public op goes.
  python benchmarks/cuda/small_ops_host_time.py [--profile]   (needs rlk-cuda and a CUDA device)
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
from collections.abc import Callable

import torch

import rlk
from rlk.bench.timing import host_and_wall_ms
from rlk.ops.group_advantages.options import GroupAdvantagesOptions
from rlk.ops.policy_loss.options import PolicyLossOptions
from rlk_cuda import group_advantages as advantages
from rlk_cuda import policy_loss

DEVICE = "cuda"
OPTIONS = PolicyLossOptions()


def report(name: str, call: Callable[[], object], reps: int = 200) -> None:
    """Print the host time per call, the wall time once drained, and the GPU time per call."""
    host, wall = host_and_wall_ms(call, reps, torch.device(DEVICE), warmup=10)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            call()
        torch.cuda.synchronize()
    gpu = sum(event.self_device_time_total for event in prof.key_averages()) / 20 / 1e3
    print(f"{name:40s} host {host:.4f} ms  wall {wall:.4f} ms  gpu {gpu:.4f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="store_true", help="cProfile the fwd+bwd loop")
    profile = parser.parse_args().profile
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    logp = -torch.rand(64, 4096, device=DEVICE, generator=gen) * 3
    old = logp + 0.2 * torch.randn(64, 4096, device=DEVICE, generator=gen)
    adv = torch.randn(64, device=DEVICE, generator=gen)
    mask = (torch.rand(64, 4096, device=DEVICE, generator=gen) > 0.2).float()
    upstream = torch.ones((), device=DEVICE)
    report("kernel policy_loss fwd",
           lambda: policy_loss.forward(logp, old, adv, mask, None, None, None, OPTIONS))
    report("kernel policy_loss bwd",
           lambda: policy_loss.backward(upstream, logp, old, adv, mask, None, None, None,
                                        OPTIONS))
    report("kernel policy_loss fwd with grad",
           lambda: policy_loss.forward.with_grad(logp, old, adv, mask, None, None, None,
                                                 OPTIONS))
    leaf = logp.clone().requires_grad_()
    rewards = torch.randn(8192, device=DEVICE)
    ids = torch.arange(8192, device=DEVICE) // 16
    shuffled = ids[torch.randperm(8192, device=DEVICE, generator=gen)]
    grpo = GroupAdvantagesOptions()
    report("kernel group_advantages (ids)",
           lambda: advantages.forward(rewards, ids, 0, 512, grpo))
    report("kernel group_advantages (shuffled ids)",
           lambda: advantages.forward(rewards, shuffled, 0, 512, grpo))
    report("kernel group_advantages (group_size)",
           lambda: advantages.forward(rewards, None, 16, 512, grpo))
    with rlk.use_backends("cuda"):
        report("rlk.policy_loss fwd", lambda: rlk.policy_loss(logp, old, adv, mask))
        report("rlk.policy_loss fwd, logp requires grad",
               lambda: rlk.policy_loss(leaf, old, adv, mask))
        report("rlk.policy_loss fwd+bwd",
               lambda: torch.autograd.grad(rlk.policy_loss(leaf, old, adv, mask)[0], leaf))
        kept = rlk.policy_loss(leaf, old, adv, mask)[0]
        report("rlk.policy_loss bwd (retained graph)",
               lambda: torch.autograd.grad(kept, leaf, retain_graph=True))
        report("rlk.policy_loss fwd+bwd, 3 settings",
               lambda: torch.autograd.grad(rlk.policy_loss(leaf, old, adv, mask, clip_high=0.28,
                                                           agg="seq-mean-token-mean",
                                                           scale=0.5)[0], leaf))
        report("rlk.group_advantages", lambda: rlk.group_advantages(rewards, group_size=16))
        report("rlk.group_advantages (shuffled ids)",
               lambda: rlk.group_advantages(rewards, group_ids=shuffled))
        if profile:
            profiler = cProfile.Profile()
            profiler.runcall(lambda: [
                torch.autograd.grad(rlk.policy_loss(leaf, old, adv, mask)[0], leaf)
                for _ in range(200)
            ])
            pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
    bare = torch.ones((), device=DEVICE, requires_grad=True)
    report("torch.autograd.grad of 2 * x (0-d)", lambda: torch.autograd.grad(bare * 2, bare))


if __name__ == "__main__":
    main()
