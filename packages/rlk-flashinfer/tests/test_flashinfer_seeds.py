"""Per-row uniforms: splitmix64 of the row's seed, whatever else is in the batch."""

from __future__ import annotations

import torch

from rlk.ops.sample import _mix64
from rlk_flashinfer.seeds import uniforms

EDGE_SEEDS = [0, 1, -1, 2**63 - 1, -(2**63), 0x1234_5678_9ABC_DEF0, -987654321]


def test_the_first_uniform_is_splitmix64_of_the_seed():
    # rlk-core's _mix64 is splitmix64's first output for a Python int: the same 64 bits
    # reached through wrapping int64 tensor arithmetic
    got = uniforms(torch.tensor(EDGE_SEEDS, dtype=torch.int64), 1)[:, 0]
    want = [((_mix64(seed) % 2**64) >> 11) * 2.0**-53 for seed in EDGE_SEEDS]
    assert got.tolist() == want


def test_uniforms_lie_in_the_unit_interval_and_depend_on_the_seed_alone():
    seeds = torch.randint(-(2**63), 2**63 - 1, (4096,), dtype=torch.int64)
    both = uniforms(seeds, 2)
    assert both.shape == (4096, 2) and both.dtype == torch.float64
    assert bool(((both >= 0) & (both < 1)).all())
    order = torch.randperm(4096)
    assert torch.equal(uniforms(seeds[order], 2), both[order])
    assert torch.equal(uniforms(seeds[7:8], 2), both[7:8])
    # the two columns are different draws, and they are close to uniform
    assert not torch.equal(both[:, 0], both[:, 1])
    assert abs(float(both.mean()) - 0.5) < 0.02


def test_neighbouring_seeds_give_unrelated_uniforms():
    seeds = torch.arange(1 << 12, dtype=torch.int64)  # rlk's int seeds differ in low bits
    first = uniforms(seeds, 1)[:, 0]
    counts = torch.histc(first, bins=16, min=0.0, max=1.0)
    assert float(counts.min()) > 0.6 * (1 << 12) / 16
