"""The public group_advantages: grouping, baselines, normalisation, edge cases, errors."""

from __future__ import annotations

import pytest
import torch

import rlk
from rlk.ops.group_advantages import reference
from rlk.ops.group_advantages.options import GroupAdvantagesOptions

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
    want = reference.group_advantages(
        rewards, torch.arange(32) // 8,
        options=GroupAdvantagesOptions(normalize=normalize, baseline=baseline))
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
        ({"group_ids": "abcdefghijkl"}, TypeError, "group_ids must be an integer tensor, a "
                                                   "NumPy array or a sequence"),
        ({"group_ids": [[0]] * 12}, TypeError, "group_ids labels must be hashable"),
        ({"group_ids": ["a"] * 11}, ValueError, r"one label per reward \(12\); got 11"),
        ({"group_size": 4, "normalize": "mad"}, ValueError,
         "normalize must be one of 'std', 'batch-std', 'none'; got 'mad'"),
        ({"group_size": 4, "nan": "drop"}, ValueError, "nan must be one of 'propagate'"),
        ({"group_size": 4, "singleton": 0}, ValueError, "singleton must be one of 'zero'"),
        ({"group_size": 4, "eps": True}, TypeError, "eps must be a float, got bool"),
        ({"group_size": 4, "epsilon": 1e-4}, TypeError, "unexpected option 'epsilon' "
                                                         ".did you mean 'eps'"),
        ({"group_size": 4, "mask": torch.ones(11, 3)}, ValueError, "mask must be"),
        ({"group_size": 4, "baseline": "median"}, ValueError, "baseline must be one of"),
        ({"group_size": 4, "eps": -1.0}, ValueError, "eps must be finite and >= 0; got -1.0"),
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
                          (rewards, ids, 0, *GroupAdvantagesOptions(baseline="loo").flat()))


def test_result_carries_no_autograd_history():
    rewards = torch.randn(4, generator=GEN).requires_grad_(True)
    assert not rlk.group_advantages(rewards, group_size=2).requires_grad


def test_eps_is_added_to_the_std():
    rewards = torch.tensor([0.0, 1.0, 0.0, 0.0])
    std = rewards[:2].std()
    for eps in (1e-6, 1e-4, 0.5):
        got = rlk.group_advantages(rewards, group_size=2, eps=eps)
        _close(got[:2], torch.tensor([-0.5, 0.5]) / (std + eps))


def test_nan_ignore_gives_zero_and_takes_the_group_statistics_from_the_rest():
    """TRL: an unscorable completion's advantage is 0 and the nan-aware baseline skips it."""
    rewards = torch.tensor([1.0, float("nan"), 3.0, 0.5, 0.5, float("nan"), 7.0, 1.0, 2.0])
    got = rlk.group_advantages(rewards, group_size=3, nan="ignore")
    rest = torch.tensor([1.0, 3.0])
    _close(got[[0, 2]], (rest - rest.mean()) / (rest.std() + 1e-6))
    assert got[1] == 0 and got[5] == 0
    assert torch.equal(got[3:5], torch.zeros(2))  # the rest of that group is constant
    _close(got[6:], rlk.group_advantages(rewards[6:], group_size=3))
    propagated = rlk.group_advantages(rewards, group_size=3)
    assert propagated[:6].isnan().all() and not propagated[6:].isnan().any()


def test_batch_std_divides_each_group_deviation_by_the_batch_std():
    """TRL scale_rewards="batch": (r - group mean) / (std of every reward + eps)."""
    rewards = torch.randn(12, generator=GEN)
    got = rlk.group_advantages(rewards, group_size=4, normalize="batch-std", eps=1e-4)
    groups = rewards.view(3, 4)
    want = (groups - groups.mean(1, keepdim=True)).flatten() / (rewards.std() + 1e-4)
    _close(got, want)


@pytest.mark.parametrize(("baseline", "normalize", "expected"), [
    ("mean", "std", lambda r: r / (1 + 1e-6)),
    ("mean", "none", lambda r: r),
    ("loo", "none", lambda r: r),
    ("mean", "batch-std", lambda r: r),  # the batch's scale is not a singleton's (#31 S6)
    ("loo", "batch-std", lambda r: r),
])
def test_singleton_reward_is_verls_convention(baseline, normalize, expected):
    rewards = torch.tensor([0.3, -1.5, 2.0, 4.0])
    ids = torch.tensor([0, 1, 2, 2])
    got = rlk.group_advantages(rewards, group_ids=ids, baseline=baseline, normalize=normalize,
                               singleton="reward")
    _close(got[:2], expected(rewards[:2]))
    zero = rlk.group_advantages(rewards, group_ids=ids, baseline=baseline, normalize=normalize)
    assert torch.equal(zero[:2], torch.zeros(2))
    _close(got[2:], zero[2:])


@pytest.mark.parametrize("eps", [1e-6, 0.0])
def test_batch_std_leaves_singletons_their_reward_as_the_reference_does(eps):
    """Issue #31 S6/F2: groups of one under batch-std were divided by the batch std (0 for
    [0.5, 0.5]: 5e5, inf at eps=0; the reference gave NaN for a zero reward at eps=0)."""
    options = GroupAdvantagesOptions(normalize="batch-std", singleton="reward", eps=eps)
    rewards = torch.cat([torch.full((2,), 0.5), torch.zeros(1), torch.randn(5, generator=GEN)])
    ids = torch.tensor([0, 1, 2, 3, 4, 4, 5, 5])
    got = rlk.group_advantages(rewards, group_ids=ids, options=options)
    assert torch.equal(got[:4], rewards[:4])
    _close(got, reference.group_advantages(rewards, ids, options=options))
    for size in (1, 2):  # all singletons; a batch of one
        one = rewards[:size]
        _close(rlk.group_advantages(one, group_size=1, options=options), one)
        _close(reference.group_advantages(one, torch.arange(size), options=options), one)


@pytest.mark.parametrize("singleton", ["zero", "reward"])
@pytest.mark.parametrize("size", [1, 9])
def test_batch_std_nan_reward_makes_the_whole_batch_nan(singleton, size):
    """Issue #31 S7: constant groups and singletons stayed 0 (docs: the whole batch NaN)."""
    rewards = torch.cat([torch.ones(4), torch.randn(5, generator=GEN)])[:size]  # constant first
    rewards[-1] = torch.nan
    ids = torch.tensor([0, 0, 1, 2, 2, 3, 3, 4, 5])[:size]
    options = GroupAdvantagesOptions(normalize="batch-std", singleton=singleton)
    assert rlk.group_advantages(rewards, group_ids=ids, options=options).isnan().all()
    assert reference.group_advantages(rewards, ids, options=options).isnan().all()
    ignored = GroupAdvantagesOptions(normalize="batch-std", singleton=singleton, nan="ignore")
    _close(rlk.group_advantages(rewards, group_ids=ids, options=ignored),
           reference.group_advantages(rewards, ids, options=ignored))


@pytest.mark.parametrize("mask", [False, True])
def test_meta_rewards_with_group_ids_give_the_output_shape(mask):
    """Issue #31: torch.unique raised torch's raw NotImplementedError on meta ids."""
    rewards = torch.empty(6, device="meta")
    ids = torch.empty(6, dtype=torch.int32, device="meta")
    extra = {"mask": torch.empty(6, 5, device="meta")} if mask else {}
    got = rlk.group_advantages(rewards, group_ids=ids, **extra)
    assert got.is_meta and got.dtype == torch.float32
    assert got.shape == ((6, 5) if mask else (6,))


def test_labels_of_any_hashable_kind():
    """verl passes NumPy arrays of uid strings; lists, tuples and integer tensors work too."""
    np = pytest.importorskip("numpy")
    rewards = torch.randn(9, generator=GEN)
    uids = ["b7", "b7", "x", "a", "x", "a", "b7", "x", "a"]
    ids = torch.tensor([0, 0, 1, 2, 1, 2, 0, 1, 2])
    want = rlk.group_advantages(rewards, group_ids=ids)
    for labels in (uids, tuple(uids), np.array(uids, dtype=object), np.array(uids),
                   np.array([7, 7, 3, 1, 3, 1, 7, 3, 1]), [(1, "a")] * 3 + [2.5] * 3 + [None] * 3):
        got = rlk.group_advantages(rewards, group_ids=labels)
        if labels[-1] is None:
            want_tuple = rlk.group_advantages(rewards, group_size=3)
            _close(got, want_tuple, atol=0, rtol=0)
        else:
            _close(got, want, atol=0, rtol=0)


def test_mask_broadcasts_advantages_over_real_tokens():
    """verl's [B, T] layout: each sample's advantage on its real tokens, 0 elsewhere."""
    rewards = torch.randn(6, generator=GEN)
    mask = torch.rand(6, 5, generator=GEN) > 0.4
    flat = rlk.group_advantages(rewards, group_size=3)
    for dtype in (torch.bool, torch.int64, torch.float32):
        got = rlk.group_advantages(rewards, group_size=3, mask=mask.to(dtype))
        assert got.shape == (6, 5) and got.dtype == torch.float32
        assert torch.equal(got, torch.where(mask, flat[:, None], 0.0))
    nan = rewards.clone()
    nan[0] = float("nan")
    masked = rlk.group_advantages(nan, group_size=3, mask=mask)
    assert torch.equal(masked[~mask], torch.zeros(int((~mask).sum())))  # 0, not NaN * 0


def test_eager_path_skips_torch_library_and_matches_the_torch_operator():
    rewards = torch.randn(20, generator=GEN)
    ids = torch.randint(0, 6, (20,), generator=GEN)
    options = GroupAdvantagesOptions(baseline="loo", nan="ignore")
    eager = rlk.group_advantages(rewards, group_ids=ids, options=options)
    op = torch.ops.rlk.group_advantages(rewards, ids, 0, *options.flat())
    assert torch.equal(eager, op)
    from torch.fx.experimental.proxy_tensor import make_fx

    graph = make_fx(lambda r: rlk.group_advantages(r, group_size=4))(rewards)
    assert "rlk.group_advantages.default" in {str(node.target) for node in graph.graph.nodes}


def test_torch_compile_dynamic_with_options_as_arguments():
    rewards = torch.randn(16, generator=GEN)

    def step(r, eps):
        return rlk.group_advantages(r, group_size=4, eps=eps, normalize="batch-std")

    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    for eps in (1e-4, 1e-2):
        _close(compiled(rewards, eps), step(rewards, eps), atol=0, rtol=0)
