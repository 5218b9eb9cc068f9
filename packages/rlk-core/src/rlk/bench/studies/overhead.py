"""Host overhead of the small public ops on the CPU, and what the kernel value checks cost.

`small_ops`: policy_loss, group_advantages, logp, logp_entropy, entropy and sample served by
the null backend (rlk.bench.studies.null_backend) at the shapes of the H200 figures (B=64
T=4096; N=8192 rewards in groups of 16; logp rows of a [4, 2048, V] batch, V kept at 16: the
null kernels never read the logits), so the time per call is rlk's overhead alone. Rows
marked "native" run the built-in kernels on tiny shapes ([4, 16] logits). `checks`: the
native backend at tiny shapes with RLK_CHECK_INPUTS off and on; the difference is their
cost. Each row is the median of many calls on the host clock.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import torch

import rlk
from rlk.bench.studies import host, null_backend

B, T, N, GROUP = 64, 4096, 8192, 16
LEAD, VOCAB, SAMPLED = (4, 2048), 16, 64
Calls = dict[str, Callable[[], object]]


def _grad(output: torch.Tensor, leaf: torch.Tensor) -> object:
    return torch.autograd.grad(output, leaf, torch.ones_like(output))


def _null_calls(gen: torch.Generator) -> Calls:
    logp = -torch.rand(B, T, generator=gen) * 3
    old = logp + 0.2 * torch.randn(B, T, generator=gen)
    adv = torch.randn(B, generator=gen)
    mask = torch.rand(B, T, generator=gen) > 0.2
    rewards = torch.randn(N, generator=gen)
    leaf = logp.clone().requires_grad_(True)
    logits = torch.randn(*LEAD, VOCAB, generator=gen, dtype=torch.bfloat16, requires_grad=True)
    tokens = torch.randint(0, VOCAB, LEAD, generator=gen)
    upstream = torch.ones(LEAD)
    to_sample = torch.randn(SAMPLED, VOCAB, generator=gen)
    seeds = torch.arange(SAMPLED)
    return {
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
        "rlk.entropy fwd+bwd": lambda: torch.autograd.grad(rlk.entropy(logits), logits, upstream),
        "rlk.sample (seeds given)": lambda: rlk.sample(to_sample, seed=seeds),
    }


def _native_calls(gen: torch.Generator) -> Calls:
    small = torch.randn(4, VOCAB, generator=gen, requires_grad=True)
    tokens = torch.randint(0, VOCAB, (4,), generator=gen)
    seeds = torch.arange(4)
    return {
        "native rlk.logp fwd+bwd": lambda: _grad(rlk.logp(small, tokens), small),
        "native rlk.entropy fwd+bwd": lambda: _grad(rlk.entropy(small), small),
        "native rlk.sample (seeds given)": lambda: rlk.sample(small.detach(), seed=seeds),
        "native rlk.sample top_k top_p":
            lambda: rlk.sample(small.detach(), seed=seeds, top_k=5, top_p=0.9),
    }


def small_ops(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Host overhead of the small public ops (CPU)")
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--profile", choices=("policy_loss", "logp", "sample"),
                        help="cProfile one row (fwd+bwd; sample: null), by own time")
    options = parser.parse_args(argv)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    null = _null_calls(gen)
    with rlk.use_backends("native"):  # its own selection cache keys: the null rows' stay apart
        for name, call in _native_calls(gen).items():
            print(f"{name:34s} {host.median_ms(call, options.reps):.4f} ms")
    null_backend.prepare((B, T), N, SAMPLED)
    null_backend.register()
    for name, call in null.items():
        print(f"{name:34s} {host.median_ms(call, options.reps):.4f} ms")
    bare = torch.ones((), requires_grad=True)
    floor = host.median_ms(lambda: torch.autograd.grad(bare * 2, bare), options.reps)
    print(f"{'autograd.grad of 2 * x (floor)':34s} {floor:.4f} ms")
    if options.profile:
        row = {"policy_loss": "rlk.policy_loss fwd+bwd", "logp": "rlk.logp fwd+bwd",
               "sample": "rlk.sample (seeds given)"}[options.profile]
        host.profile(null[row], 500, 15)
    return 0


def checks(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Cost of the kernel value checks (CPU)")
    parser.add_argument("--reps", type=int, default=500)
    reps = parser.parse_args(argv).reps
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 64, generator=gen)
    tokens = torch.randint(0, 64, (64,), generator=gen)
    logp = torch.randn(4, 16, generator=gen)
    old, advantages, mask = logp + 0.01, torch.randn(4, generator=gen), torch.ones(4, 16)
    leaf = logits.clone().requires_grad_(True)
    leaf_logp = logp.clone().requires_grad_(True)
    calls: Calls = {
        "rlk.logp fwd [64, 64]": lambda: rlk.logp(logits, tokens),
        "rlk.logp fwd+bwd [64, 64]": lambda: rlk.logp(leaf, tokens).sum().backward(),
        "rlk.policy_loss fwd+bwd [4, 16]":
            lambda: rlk.policy_loss(leaf_logp, old, advantages, mask)[0].backward(),
        "rlk.group_advantages [64]":
            lambda: rlk.group_advantages(advantages.repeat(16), group_size=4),
    }
    print(f"{'call':34} {'checks off':>11} {'checks on':>11}")
    with rlk.use_backends("native", strict=True):
        for name, call in calls.items():
            rlk.check_inputs(False)
            off = host.median_ms(call, reps)
            rlk.check_inputs(True)
            on = host.median_ms(call, reps)
            rlk.check_inputs(None)
            print(f"{name:34} {off * 1e3:8.1f} us {on * 1e3:8.1f} us")
    return 0
