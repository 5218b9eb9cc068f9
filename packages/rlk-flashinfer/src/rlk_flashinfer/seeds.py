"""Mapping rlk's per-row int64 seeds onto FlashInfer's Philox (seed, subsequence, offset).

FlashInfer's sampling kernels draw a row's random numbers from Philox with one
`seed` for the whole launch (0.6.x reads only element 0 of a seed tensor), the
row's position in the launch (`blockIdx.x`) as the subsequence, and one `offset`.
Passing all rows at once would make a row's draw depend on where it sits in the
batch. So each rlk seed is split into a Philox key (its high 58 bits) and a slot
(its low 6 bits), and the row is placed at position `slot` of a launch whose seed is
`key`, through FlashInfer's `indices` argument (the other positions repeat one of
the launch's rows and their draws are discarded). The offset is always 0. A row's
draw is then a function of its seed alone; seeds differing in any bit use disjoint
Philox streams. Rows whose seeds share a key share a launch; rows with identical
seeds go to separate launches (they must sit at the same position).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SLOT_BITS = 6
SLOTS = 1 << SLOT_BITS
_U64 = (1 << 64) - 1


@dataclass(frozen=True)
class Launch:
    """One FlashInfer sampling call: its Philox seed and where each row sits."""

    key: int
    rows: tuple[int, ...]
    slots: tuple[int, ...]

    @property
    def size(self) -> int:
        """Launch batch size: the highest occupied position plus one."""
        return max(self.slots) + 1

    def indices(self) -> list[int]:
        """FlashInfer's `indices`: position -> row; free positions repeat the first row."""
        layout = [self.rows[0]] * self.size
        for row, slot in zip(self.rows, self.slots, strict=True):
            layout[slot] = row
        return layout


def split_seed(seed: int) -> tuple[int, int]:
    """(Philox key, slot) of an int64 seed, read as its unsigned 64-bit pattern."""
    pattern = seed & _U64
    return pattern >> SLOT_BITS, pattern & (SLOTS - 1)


def plan_launches(seeds: Sequence[int]) -> list[Launch]:
    """Group rows (by position in `seeds`) into the fewest launches the mapping allows."""
    taken: dict[tuple[int, int], int] = {}
    groups: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
    for row, seed in enumerate(seeds):
        key, slot = split_seed(int(seed))
        round_ = taken.get((key, slot), 0)
        taken[(key, slot)] = round_ + 1
        rows, slots = groups.setdefault((key, round_), ([], []))
        rows.append(row)
        slots.append(slot)
    return [Launch(key, tuple(rows), tuple(slots)) for (key, _), (rows, slots) in groups.items()]
