"""rlk.group_advantages on the cuda backend against torch eager, at every group size.

Times each call as `rlk-core bench` does (CUDA events around calls issued back to back,
median of many: a host-bound op shows its host time), plus the host time per call, for
N rewards in consecutive groups three ways: group_size= ("size"), group ids in order
("ids") and the same ids and rewards shuffled ("shuffled"). Each row has the eager peer of
its own form: for "size" the reshape GRPO of consecutive groups (the fastest eager form there
is), for ids the GRPO a user writes over group labels (torch.unique with return_inverse, then
index_add_ sums), on the same ids. The peers are checked against rlk's result first. A row
whose rlk time exceeds its peer's is marked SLOWER; exit status 1 if any is.
  python benchmarks/cuda/group_advantages_sweep.py [--n 8192 65536] [--reps 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

import rlk
from rlk.bench.timing import host_and_wall_ms, time_calls

DEVICE = torch.device("cuda")
SIZES = (2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096)


def eager(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """The bench's eager peer: GRPO advantages with group std."""
    groups = rewards.view(-1, group_size)
    centred = groups - groups.mean(-1, keepdim=True)
    return (centred / (groups.std(-1, keepdim=True) + 1e-6)).view(-1)


def eager_ids(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """The peer of the id rows: the same GRPO over group labels in any order."""
    labels, inverse = torch.unique(group_ids, return_inverse=True)
    zeros = rewards.new_zeros(labels.numel())
    counts = zeros.index_add(0, inverse, torch.ones_like(rewards))
    centred = rewards - (zeros.index_add(0, inverse, rewards) / counts)[inverse]
    variance = zeros.index_add(0, inverse, centred * centred) / (counts - 1)
    return centred / (variance.sqrt()[inverse] + 1e-6)


def median_ms(call: object, reps: int) -> float:
    time_calls(lambda i: call(), 10, DEVICE)  # type: ignore[operator]
    return statistics.median(time_calls(lambda i: call(), reps, DEVICE))  # type: ignore[operator]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[8192, 65536])
    parser.add_argument("--reps", type=int, default=200)
    options = parser.parse_args()
    slower = dict.fromkeys(("size", "ids", "shuffled"), 0)
    print(f"{'N':>7} {'size':>5} {'path':>8} {'rlk ms':>8} {'eager ms':>9} {'rlk host':>9}")
    with rlk.use_backends("cuda", strict=True):
        warm = torch.rand(options.n[0], device=DEVICE)
        for _ in range(200):  # clocks and caches up before the first row counts
            eager(warm, 2)
            eager_ids(warm, torch.arange(warm.numel(), device=DEVICE) // 2)
            rlk.group_advantages(warm, group_size=2)
            rlk.group_advantages(warm, group_ids=torch.arange(warm.numel(), device=DEVICE) // 2)
        for n in options.n:
            rewards = (torch.rand(n, device=DEVICE) < 0.4).float()
            for size in [s for s in SIZES if n % s == 0 and s <= n]:
                ids = torch.arange(n, device=DEVICE) // size
                perm = torch.randperm(n, device=DEVICE)
                shuffled, shuffled_ids = rewards[perm], ids[perm]
                rows = {  # path -> (rlk call, its eager peer)
                    "size": (lambda r=rewards, s=size: rlk.group_advantages(r, group_size=s),
                             lambda r=rewards, s=size: eager(r, s)),
                    "ids": (lambda r=rewards, g=ids: rlk.group_advantages(r, group_ids=g),
                            lambda r=rewards, g=ids: eager_ids(r, g)),
                    "shuffled": (lambda r=shuffled, g=shuffled_ids:
                                 rlk.group_advantages(r, group_ids=g),
                                 lambda r=shuffled, g=shuffled_ids: eager_ids(r, g)),
                }
                for path, (call, eager_call) in rows.items():
                    if not torch.allclose(call(), eager_call(), atol=1e-4):
                        print(f"{n:>7} {size:>5} {path:>8} eager peer disagrees with rlk")
                        slower[path] += 1
                        continue
                    peer = median_ms(eager_call, options.reps)
                    ms = median_ms(call, options.reps)
                    host, _ = host_and_wall_ms(call, options.reps, DEVICE)
                    flag = ""
                    if ms > peer:
                        flag = "  SLOWER"
                        slower[path] += 1
                    print(f"{n:>7} {size:>5} {path:>8} {ms:>8.4f} {peer:>9.4f} {host:>9.4f}{flag}")
    print("rows slower than eager: " + ", ".join(f"{k} {v}" for k, v in slower.items()))
    return 1 if any(slower.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
