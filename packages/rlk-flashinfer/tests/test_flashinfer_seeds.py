"""The seed -> (Philox key, slot) mapping and the launch plan built on it."""

from __future__ import annotations

import random

from rlk_flashinfer.seeds import SLOTS, Launch, plan_launches, split_seed


def test_split_reads_the_unsigned_pattern():
    assert split_seed(0) == (0, 0)
    assert split_seed((123 << 6) | 45) == (123, 45)
    assert split_seed(-1) == ((1 << 58) - 1, SLOTS - 1)
    assert split_seed(-(2**63)) == (1 << 57, 0)


def test_split_is_injective_on_a_sample():
    generator = random.Random(0)
    seeds = {generator.randrange(-(2**63), 2**63) for _ in range(5000)} | set(range(-70, 70))
    assert len({split_seed(seed) for seed in seeds}) == len(seeds)


def test_plan_places_every_row_once_at_its_slot_under_its_key():
    generator = random.Random(1)
    seeds = [generator.randrange(-(2**63), 2**63) for _ in range(50)]
    seeds += [*list(range(1000, 1100)), 7, 7, 7, -3, -3]
    launches = plan_launches(seeds)
    placed = sorted(row for launch in launches for row in launch.rows)
    assert placed == list(range(len(seeds)))
    for launch in launches:
        assert len(set(launch.slots)) == len(launch.slots), "two rows share a position"
        layout = launch.indices()
        assert len(layout) == launch.size == max(launch.slots) + 1
        for row, slot in zip(launch.rows, launch.slots, strict=True):
            assert split_seed(seeds[row]) == (launch.key, slot)
            assert layout[slot] == row
        assert set(layout) <= set(launch.rows)


def test_consecutive_seeds_share_launches_and_duplicates_split():
    assert len(plan_launches(list(range(128)))) == 2
    duplicates = plan_launches([5, 5, 5])
    assert [launch.rows for launch in duplicates] == [(0,), (1,), (2,)]
    assert all(launch.slots == (5,) for launch in duplicates)


def test_launch_layout_fills_free_positions_with_a_row_of_the_launch():
    launch = Launch(key=9, rows=(4, 2), slots=(3, 1))
    assert launch.indices() == [4, 2, 4, 4]
