"""What the kernel value checks (RLK_CHECK_INPUTS=1: inputs unchanged, no aliased output, NaN
only where allowed) cost per call, on the native backend at tiny shapes on the CPU.

Each row is the median of many calls on the host clock, with the checks off and on; the
difference is their cost (the input range checks of RLK_CHECK_INPUTS included).
  python benchmarks/cpu/kernel_checks_overhead.py [--reps N]
"""

from __future__ import annotations

import argparse

import torch
from small_ops_overhead import median_ms  # the script beside this one

import rlk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=500)
    reps = parser.parse_args().reps
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 64, generator=gen)
    tokens = torch.randint(0, 64, (64,), generator=gen)
    logp = torch.randn(4, 16, generator=gen)
    old, advantages, mask = logp + 0.01, torch.randn(4, generator=gen), torch.ones(4, 16)
    leaf = logits.clone().requires_grad_(True)
    leaf_logp = logp.clone().requires_grad_(True)
    calls = {
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
            off = median_ms(call, reps)
            rlk.check_inputs(True)
            on = median_ms(call, reps)
            rlk.check_inputs(None)
            print(f"{name:34} {off * 1e3:8.1f} us {on * 1e3:8.1f} us")


if __name__ == "__main__":
    main()
