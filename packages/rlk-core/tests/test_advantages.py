"""The public group_advantages: grouping, baselines, normalisation, edge cases, errors."""

from __future__ import annotations

import pytest
import torch

import rlk
from rlk import reference

GEN = torch.Generator().manual_seed(5)


def _close(actual, expected, atol=1e-5, rtol=1e-5):
    torch.testing.assert_close(actual.double(), expected.double(), atol=atol, rtol=rtol,
                               equal_nan=True)


@pytest.mark.parametrize("baseline", ["mean", "loo"])
@pytest.mark.parametrize("normalize", ["std", "none"])
def test_group_size_and_group_ids_agree_with_reference(baseline, normalize):
    rewards = torch.randn(32, generator=GEN) * 2 + 1
    by_size = rlk.group_advantages(rewards, group_size=8, normalize=normalize,
                                   baseline=baseline)
    labels = (torch.arange(32) // 8) * 1000 - 7  # any integer labels
    perm = torch.randperm(32, generator=GEN)
    by_ids = rlk.group_advantages(rewards[perm], group_ids=labels[perm], normalize=normalize,
                                  baseline=baseline)
    assert by_size.dtype == torch.float32 and by_size.shape == (32,)
    _close(by_ids, by_size[perm])
    want = reference.group_advantages(rewards, torch.arange(32) // 8, normalize=normalize,
                                      baseline=baseline)
    _close(by_size, want)


def test_rloo_is_the_mean_baseline_scaled_by_n_over_n_minus_one():
    rewards = torch.randn(20, generator=GEN)
    mean = rlk.group_advantages(rewards, group_size=5, normalize="none")
    loo = rlk.group_advantages(rewards, group_size=5, normalize="none", baseline="loo")
    _close(loo, mean * 5 / 4)


@pytest.mark.parametrize("eps", [1e-6, 0.0])
@pytest.mark.parametrize("baseline", ["mean", "loo"])
def test_constant_groups_and_groups_of_one_give_exactly_zero(eps, baseline):
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.3, -2.0, 5.0, 5.0, 5.0, 5.0, 1.0, 3.0])
    ids = torch.tensor([0, 0, 0, 1, 2, 3, 4, 4, 4, 4, 5, 5])
    result = rlk.group_advantages(rewards, group_ids=ids, eps=eps, baseline=baseline)
    assert not torch.isnan(result).any()
    assert torch.equal(result[:10], torch.zeros(10))  # constant groups and singletons
    assert result[10] < 0 < result[11]


def test_nan_reward_stays_in_its_group():
    rewards = torch.randn(9, generator=GEN)
    rewards[4] = float("nan")
    result = rlk.group_advantages(rewards, group_size=3)
    assert torch.isnan(result[3:6]).all() and not torch.isnan(result[[0, 1, 2, 6, 7, 8]]).any()


def test_reduced_and_double_precision_rewards_are_accepted():
    rewards = torch.randn(12, generator=GEN)
    want = rlk.group_advantages(rewards, group_size=4)
    _close(rlk.group_advantages(rewards.double(), group_size=4), want)
    assert rlk.group_advantages(rewards.bfloat16(), group_size=4).dtype == torch.float32


def test_empty_rewards():
    assert rlk.group_advantages(torch.zeros(0), group_size=4).shape == (0,)
    empty_ids = torch.zeros(0, dtype=torch.int64)
    assert rlk.group_advantages(torch.zeros(0), group_ids=empty_ids).shape == (0,)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({}, ValueError, "exactly one of group_size"),
        ({"group_size": 4, "group_ids": torch.zeros(12, dtype=torch.int64)}, ValueError,
         "exactly one of group_size"),
        ({"group_size": 5}, ValueError, r"divide the number of rewards \(12\); got 5"),
        ({"group_size": 0}, ValueError, "group_size must be >= 1"),
        ({"group_size": 2.0}, TypeError, "group_size must be an int"),
        ({"group_ids": torch.zeros(11, dtype=torch.int64)}, ValueError,
         r"group_ids must have shape \(12,\)"),
        ({"group_ids": torch.zeros(12)}, TypeError, "group_ids must have dtype"),
        ({"group_size": 4, "normalize": "mad"}, ValueError,
         "normalize must be one of 'std', 'none'; got 'mad'"),
        ({"group_size": 4, "baseline": "median"}, ValueError, "baseline must be one of"),
        ({"group_size": 4, "eps": -1.0}, ValueError, "eps must be finite and >= 0"),
    ],
)
def test_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        rlk.group_advantages(torch.randn(12, generator=GEN), **kwargs)


def test_rewards_must_be_one_dimensional_floats():
    with pytest.raises(ValueError, match=r"rewards must be 1-D \[N\]; got shape \(3, 4\)"):
        rlk.group_advantages(torch.randn(3, 4), group_size=4)
    with pytest.raises(TypeError, match="rewards must have dtype"):
        rlk.group_advantages(torch.ones(4, dtype=torch.int64), group_size=2)


def test_torch_compile_fullgraph_and_opcheck():
    rewards = torch.randn(16, generator=GEN)
    ids = torch.randint(0, 5, (16,), generator=GEN)

    def both(r):
        return (rlk.group_advantages(r, group_size=4),
                rlk.group_advantages(r, group_ids=ids, baseline="loo"))

    compiled = torch.compile(both, fullgraph=True)
    for got, want in zip(compiled(rewards), both(rewards), strict=True):
        _close(got, want, atol=0, rtol=0)
    torch.library.opcheck(torch.ops.rlk.group_advantages.default,
                          (rewards, ids, 0, "std", "mean", 1e-6))


def test_result_carries_no_autograd_history():
    rewards = torch.randn(4, generator=GEN).requires_grad_(True)
    assert not rlk.group_advantages(rewards, group_size=2).requires_grad
