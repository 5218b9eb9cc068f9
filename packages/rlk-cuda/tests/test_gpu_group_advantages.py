"""group_advantages kernel against a float64 reference written from the definition."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from rlk._runtime.spec import specs
from rlk.ops.group_advantages import native, reference
from rlk.ops.group_advantages.options import GroupAdvantagesOptions
from rlk.testing.poison import poisoned_allocations

from rlk_cuda.group_advantages import forward

pytestmark = pytest.mark.gpu


def _options(normalize: str = "std", baseline: str = "mean", eps: float = 1e-6,
             **settings: Any) -> GroupAdvantagesOptions:
    return GroupAdvantagesOptions(normalize=normalize, baseline=baseline, eps=eps, **settings)


def _reference(
    rewards: torch.Tensor, ids: torch.Tensor, normalize: str, baseline: str, eps: float,
    **settings: Any,
) -> torch.Tensor:
    """rlk's float64 reference (a group of one gets 0 under either baseline)."""
    return reference.group_advantages(rewards.cpu(), ids.cpu(),
                                      options=_options(normalize, baseline, eps, **settings))


def _forward(rewards: torch.Tensor, ids: torch.Tensor | None, groups: int, normalize: str,
             baseline: str, eps: float, group_size: int = 0, **settings: Any) -> torch.Tensor:
    return forward(rewards, ids, group_size, groups, _options(normalize, baseline, eps,
                                                              **settings))


@pytest.mark.parametrize("normalize", ["std", "none"])
@pytest.mark.parametrize("baseline", ["mean", "loo"])
@pytest.mark.parametrize(
    ("n", "groups", "shuffled"), [(64, 8, False), (1000, 37, True), (8192, 1024, False)]
)
def test_matches_float64(
    normalize: str, baseline: str, n: int, groups: int, shuffled: bool
) -> None:
    gen = torch.Generator(device="cuda").manual_seed(n)
    rewards = torch.randn(n, generator=gen, device="cuda")
    ids = torch.arange(n, device="cuda") % groups
    if shuffled:
        ids = ids[torch.randperm(n, generator=gen, device="cuda")]
    else:
        ids = torch.arange(n, device="cuda") // (n // groups)
        groups = int(ids.max()) + 1
    with poisoned_allocations():
        got = _forward(rewards, ids, groups, normalize, baseline, 1e-6)
    want = _reference(rewards, ids, normalize, baseline, 1e-6)
    assert (got.double().cpu() - want).abs().max() < 1e-5


def test_constant_groups_nan_and_singletons() -> None:
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.3, float("nan"), 2.0, 5.0], device="cuda")
    ids = torch.tensor([0, 0, 0, 1, 1, 2, 3], device="cuda")
    got = _forward(rewards, ids, 4, "std", "mean", 0.0)
    assert torch.equal(got[:3], torch.zeros(3, device="cuda"))
    assert got[3:5].isnan().all()
    assert got[5] == 0 and got[6] == 0
    loo = _forward(rewards, ids, 4, "none", "loo", 0.0)
    assert loo[5] == 0 and loo[6] == 0


def test_deterministic() -> None:
    rewards = torch.randn(5000, device="cuda")
    ids = torch.randint(0, 300, (5000,), device="cuda")
    a = _forward(rewards, ids, 300, "std", "mean", 1e-6)
    b = _forward(rewards, ids, 300, "std", "mean", 1e-6)
    assert torch.equal(a, b)


def _check(rewards: torch.Tensor, ids: torch.Tensor, groups: int) -> None:
    for normalize, baseline in (("std", "mean"), ("none", "loo")):
        with poisoned_allocations():
            got = _forward(rewards, ids, groups, normalize, baseline, 1e-6)
        want = _reference(rewards, ids, normalize, baseline, 1e-6)
        assert (got.double().cpu() - want).abs().max() < 1e-5


@pytest.mark.parametrize(("n", "groups"), [(8192, 512), (8192, 4), (3000, 1), (65536, 4096)])
def test_consecutive_groups_small_and_large(n: int, groups: int) -> None:
    """32 lanes per group for small groups, a block per group for large ones."""
    gen = torch.Generator(device="cuda").manual_seed(groups)
    rewards = (torch.rand(n, generator=gen, device="cuda") < 0.4).float()
    rewards += torch.randn(n, generator=gen, device="cuda") * 0.1
    ids = torch.arange(n, device="cuda") // (n // groups)
    _check(rewards, ids, groups)


@pytest.mark.parametrize("large", [False, True])
def test_consecutive_groups_of_uneven_sizes(large: bool) -> None:
    """Ordered ids whose runs differ in size (binary search), with an id that has no member."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    sizes = torch.randint(1, 600 if large else 40, (300,), generator=gen, device="cuda")
    sizes[7] = 0
    ids = torch.repeat_interleave(torch.arange(300, device="cuda"), sizes)
    rewards = torch.randn(ids.numel(), generator=gen, device="cuda")
    _check(rewards, ids, 300)


@pytest.mark.parametrize("order", ["sorted", "reversed", "shuffled", "one-swap", "interleaved"])
@pytest.mark.parametrize(("n", "groups"), [(4096, 1024), (65536, 64), (20000, 5), (3001, 1),
                                           (65536, 32768)])
def test_ids_in_any_order(order: str, n: int, groups: int) -> None:
    """Ids are sorted stably on the device first: any order is read as runs, with small
    groups (a warp each), large ones (a block each) and one group of everything."""
    gen = torch.Generator(device="cuda").manual_seed(n + groups)
    ids = torch.arange(n, device="cuda") * groups // n
    rewards = (torch.rand(n, generator=gen, device="cuda") < 0.4).float()
    rewards += torch.randn(n, generator=gen, device="cuda") * 0.1
    if order == "reversed":
        ids = ids.flip(0)
    elif order == "shuffled":
        ids = ids[torch.randperm(n, generator=gen, device="cuda")]
    elif order == "one-swap":  # two groups trade a member
        ids[[n // 3, 2 * n // 3]] = ids[[2 * n // 3, n // 3]].clone()
    elif order == "interleaved":
        ids = torch.arange(n, device="cuda") % groups
    if groups > 2048:  # the float64 reference loops over groups: the native kernel instead
        options = _options()
        want = native.forward(rewards, ids, 0, groups, options)
        assert (forward(rewards, ids, 0, groups, options) - want).abs().max() < 1e-5
    else:
        _check(rewards, ids, groups)
    first = forward(rewards, ids, 0, groups, _options())
    assert torch.equal(forward(rewards, ids, 0, groups, _options()), first)


def test_ids_of_any_integer_dtype() -> None:
    rewards = torch.randn(1000, device="cuda")
    ids = torch.randint(0, 50, (1000,), device="cuda")
    want = forward(rewards, ids, 0, 50, _options())
    for dtype in (torch.int32, torch.int16, torch.uint8):
        assert torch.equal(forward(rewards, ids.to(dtype), 0, 50, _options()), want)


SPEC = specs()["group_advantages"]
SAMPLE_NAMES = [sample.name for sample in SPEC.samples(torch.device("cpu"), torch.float32)]


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_conformance_samples(name: str) -> None:
    (sample,) = [s for s in SPEC.samples(torch.device("cuda"), torch.float32) if s.name == name]
    with poisoned_allocations():
        got = forward(**sample.args)
    (want,) = SPEC.reference(sample.args)
    assert got.shape == want.shape
    assert torch.equal(got.isnan().cpu(), want.isnan().cpu())
    assert ((got.double().cpu() - want.cpu()).nan_to_num().abs() < 1e-5).all()


@pytest.mark.parametrize(("n", "size"), [(8192, 2), (8192, 16), (8192, 64), (8192, 512),
                                         (65536, 16), (3000, 3000)])
@pytest.mark.parametrize("settings", [{}, {"normalize": "batch-std", "eps": 1e-4},
                                      {"nan": "ignore", "baseline": "loo"},
                                      {"singleton": "reward", "normalize": "none"}])
def test_group_size_reads_runs_without_ids(n: int, size: int, settings: dict[str, Any]) -> None:
    """group_size= launches one kernel over runs [g * size, (g + 1) * size): no id tensor."""
    gen = torch.Generator(device="cuda").manual_seed(n + size)
    rewards = (torch.rand(n, generator=gen, device="cuda") < 0.4).float()
    rewards[::7] = float("nan")
    ids = torch.arange(n, device="cuda") // size
    options = GroupAdvantagesOptions(**settings)
    with poisoned_allocations():
        by_size = forward(rewards, None, size, n // size, options)
        by_ids = forward(rewards, ids, 0, n // size, options)
    assert torch.equal(by_size.isnan(), by_ids.isnan())
    assert torch.equal(by_size.nan_to_num(), by_ids.nan_to_num())
    want = reference.group_advantages(rewards.cpu()[:4 * size], ids.cpu()[:4 * size],
                                      options=options)
    if options.normalize != "batch-std":  # the batch's std needs the whole batch
        got = by_size[:4 * size].double().cpu()
        assert torch.equal(got.isnan(), want.isnan())
        assert (got - want).nan_to_num().abs().max() < 1e-5


def test_batch_std_over_the_whole_batch() -> None:
    gen = torch.Generator(device="cuda").manual_seed(4)
    rewards = torch.randn(4096, generator=gen, device="cuda")
    options = GroupAdvantagesOptions(normalize="batch-std", eps=1e-4)
    got = forward(rewards, None, 16, 256, options)
    want = reference.group_advantages(rewards.cpu(), torch.arange(4096) // 16, options=options)
    assert (got.double().cpu() - want).abs().max() < 1e-5


@pytest.mark.parametrize("singleton", ["zero", "reward"])
@pytest.mark.parametrize("eps", [1e-6, 0.0])
@pytest.mark.parametrize("case", ["singletons", "one", "nan", "nan-one", "nan-ignore"])
def test_batch_std_singletons_and_nan_match_the_reference(singleton: str, eps: float,
                                                          case: str) -> None:
    """Issue #31 S6, S7, F2: a singleton keeps its reward under batch-std (singleton="reward"),
    a NaN reward under nan="propagate" makes the whole batch NaN, constant groups included."""
    gen = torch.Generator(device="cuda").manual_seed(31)
    rewards = torch.cat([torch.full((4,), 0.5, device="cuda"),
                         torch.randn(6, generator=gen, device="cuda")])
    ids = torch.tensor([0, 0, 1, 2, 3, 3, 4, 4, 4, 5], device="cuda")
    if case in ("one", "nan-one"):
        rewards, ids = rewards[:1], ids[:1]
    if case.startswith("nan"):
        rewards[-1] = float("nan")
    settings = {"nan": "ignore"} if case == "nan-ignore" else {}
    groups = int(ids.max()) + 1
    with poisoned_allocations():
        got = _forward(rewards, ids, groups, "batch-std", "mean", eps, singleton=singleton,
                       **settings)
    want = _reference(rewards, ids, "batch-std", "mean", eps, singleton=singleton, **settings)
    torch.testing.assert_close(got.double().cpu(), want, atol=1e-5, rtol=1e-5, equal_nan=True)
    native_got = native.forward(rewards.cpu(), ids.cpu(), 0, groups,
                                _options("batch-std", "mean", eps, singleton=singleton,
                                         **settings))
    torch.testing.assert_close(got.cpu(), native_got, atol=1e-5, rtol=1e-5, equal_nan=True)
