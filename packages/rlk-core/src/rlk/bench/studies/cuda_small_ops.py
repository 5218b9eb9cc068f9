"""Host time against GPU time of the small cuda ops (policy_loss, group_advantages).

Each call is timed on the host (no sync inside the loop) and under torch.profiler for its
GPU time, once through the rlk_cuda kernel functions and once through the public rlk op,
at B=64 T=4096 (policy_loss) and N=8192 rewards in groups of 16 (group_advantages).
`--profile` adds a cProfile of rlk.policy_loss forward+backward, by own time: where the
host time of the public op goes. Needs rlk-cuda and a CUDA device.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import torch

import rlk
from rlk.bench.studies import host
from rlk.ops.group_advantages.options import GroupAdvantagesOptions
from rlk.ops.policy_loss.options import PolicyLossOptions

DEVICE = torch.device("cuda")


def _report(name: str, call: Callable[[], object]) -> None:
    print(host.line(name, call, 200, DEVICE, warmup=10, gpu=True, width=40))


def _kernel_rows(logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                 rewards: torch.Tensor, shuffled: torch.Tensor) -> None:
    from rlk_cuda import group_advantages as advantages
    from rlk_cuda import policy_loss

    options, grpo = PolicyLossOptions(), GroupAdvantagesOptions()
    upstream = torch.ones((), device=DEVICE)
    ids = torch.arange(rewards.numel(), device=DEVICE) // 16
    _report("kernel policy_loss fwd",
            lambda: policy_loss.forward(logp, old, adv, mask, None, None, None, options))
    _report("kernel policy_loss bwd",
            lambda: policy_loss.backward(upstream, logp, old, adv, mask, None, None, None,
                                         options))
    _report("kernel policy_loss fwd with grad",
            lambda: policy_loss.with_grad(logp, old, adv, mask, None, None, None, options))
    _report("kernel group_advantages (ids)",
            lambda: advantages.forward(rewards, ids, 0, 512, grpo))
    _report("kernel group_advantages (shuffled ids)",
            lambda: advantages.forward(rewards, shuffled, 0, 512, grpo))
    _report("kernel group_advantages (group_size)",
            lambda: advantages.forward(rewards, None, 16, 512, grpo))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Host against GPU time of the small cuda ops")
    parser.add_argument("--profile", action="store_true", help="cProfile the fwd+bwd loop")
    profile = parser.parse_args(argv).profile
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    logp = -torch.rand(64, 4096, device=DEVICE, generator=gen) * 3
    old = logp + 0.2 * torch.randn(64, 4096, device=DEVICE, generator=gen)
    adv = torch.randn(64, device=DEVICE, generator=gen)
    mask = (torch.rand(64, 4096, device=DEVICE, generator=gen) > 0.2).float()
    leaf = logp.clone().requires_grad_()
    rewards = torch.randn(8192, device=DEVICE)
    shuffled = (torch.arange(8192, device=DEVICE) // 16)[
        torch.randperm(8192, device=DEVICE, generator=gen)]
    _kernel_rows(logp, old, adv, mask, rewards, shuffled)

    def step() -> object:
        return torch.autograd.grad(rlk.policy_loss(leaf, old, adv, mask)[0], leaf)

    with rlk.use_backends("cuda"):
        _report("rlk.policy_loss fwd", lambda: rlk.policy_loss(logp, old, adv, mask))
        _report("rlk.policy_loss fwd, logp requires grad",
                lambda: rlk.policy_loss(leaf, old, adv, mask))
        _report("rlk.policy_loss fwd+bwd", step)
        kept = rlk.policy_loss(leaf, old, adv, mask)[0]
        _report("rlk.policy_loss bwd (retained graph)",
                lambda: torch.autograd.grad(kept, leaf, retain_graph=True))
        _report("rlk.policy_loss fwd+bwd, 3 settings",
                lambda: torch.autograd.grad(rlk.policy_loss(
                    leaf, old, adv, mask, clip_high=0.28, agg="seq-mean-token-mean",
                    scale=0.5)[0], leaf))
        _report("rlk.group_advantages", lambda: rlk.group_advantages(rewards, group_size=16))
        _report("rlk.group_advantages (shuffled ids)",
                lambda: rlk.group_advantages(rewards, group_ids=shuffled))
        if profile:
            host.profile(step, 200, 15)
    bare = torch.ones((), device=DEVICE, requires_grad=True)
    _report("torch.autograd.grad of 2 * x (0-d)", lambda: torch.autograd.grad(bare * 2, bare))
    return 0
