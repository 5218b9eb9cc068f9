"""group_advantages against float64, fuzzed: every option (normalize, baseline, eps down to
0, nan mode, singleton mode), groups as a size or as labels (integer tensors, strings) with
unequal sizes and singletons, NaN rewards, constant groups, rewards on a scale of tens, and
the [N, T] form with `mask`. The batch-std regime is split where issue #31 found wrong
values (singletons, NaN rewards under "propagate", eps=0)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from fuzzing import fuzz, generator, on_device, snapshot, tally, unchanged
from hypothesis import strategies as st

import rlk
from rlk._runtime.spec import specs
from rlk.ops.group_advantages import reference
from rlk.ops.group_advantages.options import GroupAdvantagesOptions
from rlk.testing.compare import assert_matches

REGIMES = ("std", "none", "batch-std",
           "batch-std-edges")


@st.composite
def advantage_calls(draw, regime: str):
    gen = generator(draw)
    edges = regime != "batch-std"  # singletons, NaN propagation and eps=0 allowed
    groups = draw(st.sampled_from([0, 1, 3, 8]))
    sizes = [draw(st.sampled_from([1, 2, 4, 16] if edges else [2, 4, 16]))] * groups
    labels = draw(st.sampled_from(["size", "tensor", "strings"]))
    if labels != "size":  # unequal groups
        sizes = [draw(st.sampled_from([1, 2, 3, 5] if edges else [2, 3, 5]))
                 for _ in range(groups)]
    count = sum(sizes)
    kind = draw(st.sampled_from(["gaussian", "binary", "constant", "offset"]))
    if kind == "binary":
        rewards = (torch.rand(count, generator=gen) > 0.5).float()
    elif kind == "constant":
        rewards = torch.full((count,), 0.75)
    elif kind == "offset":  # scores on a scale of tens, as reward models give
        rewards = torch.randn(count, generator=gen) * 3 + 20
    else:
        rewards = torch.randn(count, generator=gen)
    nan_modes = ["propagate", "ignore"] if edges else ["ignore"]
    options = GroupAdvantagesOptions(
        normalize=regime.removesuffix("-edges"),
        baseline=draw(st.sampled_from(["mean", "loo"])),
        eps=draw(st.sampled_from([0.0, 1e-6, 1e-4] if edges else [1e-6, 1e-4])),
        nan=draw(st.sampled_from(nan_modes)),
        singleton=draw(st.sampled_from(["zero", "reward"])))
    if count and draw(st.booleans()):
        rewards[draw(st.integers(0, count - 1))] = float("nan")
    ids = torch.repeat_interleave(torch.arange(groups), torch.tensor(sizes, dtype=torch.long))
    if labels != "size":
        ids = ids[torch.randperm(count, generator=gen)]
    mask = None
    if draw(st.booleans()):
        mask = torch.rand(count, draw(st.sampled_from([1, 4])), generator=gen) > 0.3
    return rewards.to(draw(st.sampled_from([torch.float32, torch.float64, torch.bfloat16]))), \
        ids, labels, sizes[0] if sizes else 1, options, mask


@pytest.mark.parametrize("regime", REGIMES)
@fuzz(data=st.data())
def test_group_advantages_against_float64(regime, data):
    tally("group_advantages")
    rewards, ids, labels, size, options, mask = data.draw(advantage_calls(regime))
    if labels == "size":
        grouping: dict[str, Any] = {"group_size": size}
    elif labels == "tensor":
        grouping = {"group_ids": on_device(ids * 7 - 3)}  # any integer labels
    else:
        grouping = {"group_ids": [f"uid-{int(i)}" for i in ids]}
    device_rewards, device_mask = on_device(rewards), on_device(mask)
    before = snapshot(rewards=device_rewards, mask=device_mask)
    got = rlk.group_advantages(device_rewards, mask=device_mask, options=options, **grouping)
    unchanged(before, rewards=device_rewards, mask=device_mask)
    want = reference.group_advantages(rewards, ids, options=options)
    if mask is not None:  # the sample's advantage on its real tokens, 0 elsewhere
        want = torch.where(mask, want[:, None], torch.zeros((), dtype=want.dtype))
    assert got.dtype == torch.float32, got.dtype
    assert_matches("advantages", got, want, specs()["group_advantages"].tolerances[torch.float32])
