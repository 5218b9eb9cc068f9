"""Per-row uniforms: splitmix64 of the row's seed, whatever else is in the batch."""

from __future__ import annotations

import pytest
import torch

from rlk.ops.sample.op import _mix64

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from rlk_flashinfer.seeds import uniform  # noqa: E402  (needs triton)

EDGE_SEEDS = [0, 1, -1, 2**63 - 1, -(2**63), 0x1234_5678_9ABC_DEF0, -987654321]


@triton.jit
def _uniforms(seeds, out):
    row = tl.program_id(0)
    seed = tl.load(seeds + row)
    tl.store(out + 2 * row, uniform(seed, 1))
    tl.store(out + 2 * row + 1, uniform(seed, 2))


def uniforms(seeds: torch.Tensor) -> torch.Tensor:
    out = torch.empty(seeds.shape[0], 2, dtype=torch.float64)
    _uniforms[(seeds.shape[0],)](seeds, out)
    return out


def test_the_uniforms_are_splitmix64_of_the_seed():
    # rlk-core's _mix64 is splitmix64's first output for a Python int; the second output
    # is _mix64 of the seed plus the increment
    got = uniforms(torch.tensor(EDGE_SEEDS, dtype=torch.int64))
    gamma = 0x9E3779B97F4A7C15
    for column, step in ((0, 0), (1, gamma)):
        want = [((_mix64((seed + step) % 2**64) % 2**64) >> 11) * 2.0**-53 for seed in EDGE_SEEDS]
        assert got[:, column].tolist() == want


def test_uniforms_lie_in_the_unit_interval_and_depend_on_the_seed_alone():
    seeds = torch.randint(-(2**63), 2**63 - 1, (512,), dtype=torch.int64)
    both = uniforms(seeds)
    assert bool(((both >= 0) & (both < 1)).all())
    order = torch.randperm(512)
    assert torch.equal(uniforms(seeds[order]), both[order])
    assert torch.equal(uniforms(seeds[7:8]), both[7:8])
    assert not torch.equal(both[:, 0], both[:, 1])
    assert abs(float(both.mean()) - 0.5) < 0.04


def test_neighbouring_seeds_give_unrelated_uniforms():
    seeds = torch.arange(1 << 10, dtype=torch.int64)  # rlk's int seeds differ in low bits
    first = uniforms(seeds)[:, 0]
    counts = torch.histc(first, bins=8, min=0.0, max=1.0)
    assert float(counts.min()) > 0.6 * (1 << 10) / 8
