"""Per-row uniforms from rlk's int64 row seeds, computed on the device with no host sync.

FlashInfer's samplers cannot key a row's random numbers by that row's seed alone. In 0.6.x
every sampling kernel reads element 0 of a seed (and offset) tensor, whatever its length;
from 0.7 each row reads its own seed, but the Philox subsequence is still the row's position
in the launch (`curand_init(seed, blockIdx.x, offset)`). Either way a row's draw would move
with the batch around it. So the backend draws with its own uniforms: the first outputs of
splitmix64 seeded with the row's seed (64-bit arithmetic that wraps in int64 tensors), which
depend on that seed alone, for any seeds, in one pass over the batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

_GAMMA = 0x9E3779B97F4A7C15
_MULTIPLIERS = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)


def _int64(value: int) -> int:
    """The int64 with the same 64-bit pattern as the unsigned `value`."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift_right(z: Tensor, bits: int) -> Tensor:
    """Logical right shift of int64 patterns (torch's >> is arithmetic)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _finalise(z: Tensor) -> Tensor:
    z = (z ^ _shift_right(z, 30)) * _int64(_MULTIPLIERS[0])
    z = (z ^ _shift_right(z, 27)) * _int64(_MULTIPLIERS[1])
    return z ^ _shift_right(z, 31)


def uniforms(seeds: Tensor, count: int) -> Tensor:
    """[B, count] float64 uniforms in [0, 1): outputs 1..count of splitmix64 from each seed."""
    steps = torch.arange(1, count + 1, dtype=torch.int64, device=seeds.device) * _int64(_GAMMA)
    return _shift_right(_finalise(seeds[:, None] + steps), 11).double() * 2.0**-53
