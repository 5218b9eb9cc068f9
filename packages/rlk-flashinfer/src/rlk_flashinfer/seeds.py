"""Per-row uniforms from rlk's int64 row seeds, computed inside the sampling kernel.

FlashInfer's samplers cannot key a row's random numbers by that row's seed alone. In 0.6.x
every sampling kernel reads element 0 of a seed (and offset) tensor, whatever its length;
from 0.7 each row reads its own seed, but the Philox subsequence is still the row's position
in the launch (`curand_init(seed, blockIdx.x, offset)`). Either way a row's draw would move
with the batch around it. So the backend draws with its own uniforms: outputs 1 and 2 of
splitmix64 seeded with the row's seed (wrapping uint64 arithmetic), which depend on that
seed alone.
"""

from __future__ import annotations

import triton
import triton.language as tl

_GAMMA = tl.constexpr(0x9E3779B97F4A7C15)


@triton.jit
def uniform(seed, index: tl.constexpr):
    """Output `index` (1, 2, ...) of splitmix64 from an int64 `seed`: a float64 in [0, 1)."""
    z = seed.to(tl.uint64, bitcast=True)
    for _ in tl.static_range(index):
        z = z + _GAMMA
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    z = z ^ (z >> 31)
    return (z >> 11).to(tl.float64) * 1.1102230246251565e-16  # 2**-53
