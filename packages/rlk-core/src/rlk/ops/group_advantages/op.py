"""`group_advantages`: GRPO / RLOO / Dr. GRPO advantages from per-sample rewards.

Every setting is a field of `GroupAdvantagesOptions`; docs/ops/group_advantages.md gives
each formula and which TRL / verl setting it matches.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from rlk._runtime import kernel_checks, validate
from rlk._runtime.contract import Out
from rlk._runtime.operator import Operator
from rlk._runtime.signature import Signature, options_param, plain
from rlk._runtime.spec import NativeKernel, OpSpec, Sample, Tolerance
from rlk.ops.group_advantages import reference
from rlk.ops.group_advantages.options import GroupAdvantagesOptions

FLOATS = validate.ANY_FLOAT
LABELS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
MASKS = (torch.bool, *LABELS, *FLOATS)


def dense_ids(group_ids: Tensor) -> tuple[Tensor, int]:
    """Integer labels renumbered 0..G-1 (in label order), and G. Meta labels (shape
    propagation) hold no values to renumber: they pass as int64, G bounded by their count."""
    if group_ids.is_meta:
        return group_ids.to(torch.int64), int(group_ids.numel())
    labels, ids = torch.unique(group_ids, return_inverse=True)
    return ids.to(torch.int64), int(labels.numel())


def _label_ids(labels: Any, count: int, device: torch.device) -> Tensor:
    """Group labels of any hashable kind (strings, NumPy arrays of uids) as int64 ids,
    numbered by first appearance so that consecutive groups stay in order."""
    ordered = isinstance(labels, Sequence) or hasattr(labels, "__array__")  # NumPy arrays
    if isinstance(labels, (str, bytes)) or not ordered:
        raise TypeError("group_ids must be an integer tensor, a NumPy array or a sequence of "
                        f"hashable labels; got {type(labels).__name__}")
    if len(labels) != count:
        raise ValueError(f"group_ids must have one label per reward ({count}); "
                         f"got {len(labels)}")
    numbering: dict[Hashable, int] = {}
    try:
        ids = [numbering.setdefault(label, len(numbering)) for label in labels]
    except TypeError as exc:
        raise TypeError(f"group_ids labels must be hashable: {exc}") from None
    return torch.tensor(ids, dtype=torch.int64, device=device)


def _prepare(rewards: Tensor, group_size: int | None, group_ids: Any,
             options: GroupAdvantagesOptions) -> dict[str, Any]:
    """Validate the public arguments (no device sync); rewards come back as float32 and
    labels other than tensors as int64 ids on the rewards' device."""
    validate.tensor("rewards", rewards, FLOATS)
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N]; got shape {tuple(rewards.shape)}")
    if (group_size is None) == (group_ids is None):
        raise ValueError("give exactly one of group_size= (consecutive groups of that size) "
                         "or group_ids= (a group label per reward)")
    size = 0
    if group_size is not None:
        size = validate.integer("group_size", group_size)
        if size < 1 or rewards.shape[0] % size != 0:
            raise ValueError(f"group_size must be >= 1 and divide the number of rewards "
                             f"({rewards.shape[0]}); got {group_size}")
    if group_ids is not None and not isinstance(group_ids, Tensor):
        group_ids = _label_ids(group_ids, rewards.shape[0], rewards.device)
    if group_ids is not None:
        validate.tensor("group_ids", group_ids, LABELS)
        validate.shape("group_ids", group_ids, tuple(rewards.shape), " (one label per reward)")
        validate.same_device("group_ids", group_ids, rewards, "rewards")
    return {"rewards": rewards.detach().to(torch.float32), "group_ids": group_ids,
            "group_size": size, "options": options}


def _kernel_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """Op arguments -> kernel arguments: labels renumbered 0..G-1 (one device sync)."""
    rewards, size = args["rewards"], args["group_size"]
    if args["group_ids"] is None:
        ids, count = None, rewards.shape[0] // size
    else:
        ids, count = dense_ids(args["group_ids"])
    return {"rewards": rewards, "group_ids": ids, "group_size": size, "num_groups": count,
            "options": args["options"]}


SIGNATURE = Signature((plain("rewards", "Tensor"), plain("group_ids", "Tensor?"),
                       plain("group_size", "int"),
                       options_param("options", GroupAdvantagesOptions)))


def group_advantages(
    rewards: Tensor,
    *,
    group_size: int | None = None,
    group_ids: Tensor | Sequence[Hashable] | Any = None,
    mask: Tensor | None = None,
    options: GroupAdvantagesOptions | None = None,
    **settings: Any,
) -> Tensor:
    """Per-sample advantages: reward minus its group's baseline, optionally over a std.

    Groups are consecutive runs of `group_size` rewards, or the rewards sharing a label
    in `group_ids`: an integer tensor, a NumPy array or any sequence of hashable labels
    (verl's uid strings). Settings are `GroupAdvantagesOptions` fields (normalize,
    baseline, eps, nan, singleton), as `options=` and/or keywords. Constant groups give
    exactly 0. Returns float32 [N], or [N, T] with `mask` ([N, T], nonzero = a real token):
    each sample's advantage on its real tokens, 0 elsewhere (verl's layout). Not
    differentiable.
    """
    chosen = GroupAdvantagesOptions.build(options, settings)
    args = _prepare(rewards, group_size, group_ids, chosen)
    if mask is not None:
        validate.tensor("mask", mask, MASKS)
        if mask.dim() != 2 or mask.shape[0] != rewards.shape[0]:
            raise ValueError(f"mask must be [N, T] with N = {rewards.shape[0]} (one row per "
                             f"reward); got shape {tuple(mask.shape)}")
        validate.same_device("mask", mask, rewards, "rewards")
    advantages = GROUP_ADVANTAGES.call(args)
    if mask is None:
        return advantages
    return torch.where(mask != 0, advantages.unsqueeze(1), 0.0)


# ---------------------------------------------------------------------------
# conformance samples and the spec


def _samples(device: torch.device, dtype: torch.dtype) -> Iterator[Sample]:
    gen = torch.Generator().manual_seed(77)

    def case(name: str, rewards: Tensor, ids: Tensor | None, group_size: int = 0,
             **settings: Any) -> Sample:
        count = rewards.numel() // group_size if ids is None else (
            int(ids.max()) + 1 if ids.numel() else 0)
        args = {"rewards": rewards.to(device), "group_ids": None if ids is None else ids.to(device),
                "group_size": group_size, "num_groups": count,
                "options": GroupAdvantagesOptions(**settings)}
        return Sample(name, args, check_backward=False)

    def rewards(count: int) -> Tensor:
        return torch.randn(count, generator=gen)

    fixed = torch.arange(24) // 4
    yield case("grpo", rewards(24), fixed)
    yield case("grpo-group-size", rewards(24), None, group_size=4)
    yield case("rloo", rewards(24), fixed, baseline="loo", normalize="none")
    yield case("rloo-std", rewards(24), fixed, baseline="loo")
    yield case("dr-grpo", rewards(24), fixed, normalize="none")
    yield case("batch-std", rewards(24), None, group_size=6, normalize="batch-std", eps=1e-4)
    yield case("shuffled-ids", rewards(30), torch.randperm(30, generator=gen) % 7)
    uneven = torch.tensor([0, 0, 0, 1, 2, 2, 3, 3, 3, 3, 3])
    for baseline in ("mean", "loo"):
        yield case(f"groups-of-one-{baseline}", rewards(11), uneven, baseline=baseline)
        yield case(f"groups-of-one-{baseline}-verl", rewards(11), uneven, baseline=baseline,
                   singleton="reward")
    yield case("groups-of-one-verl-none", rewards(11), uneven, normalize="none",
               singleton="reward")
    binary = (torch.rand(16, generator=gen) > 0.5).float()
    binary[:4] = 1.0
    binary[4:8] = 0.0
    yield case("constant-groups", binary, torch.arange(16) // 4)
    yield case("constant-groups-eps-zero", binary, torch.arange(16) // 4, eps=0.0)
    yield case("constant-groups-batch-std", binary, None, group_size=4, normalize="batch-std")
    with_nan = rewards(15)
    with_nan[[5, 9, 10]] = float("nan")  # groups [3:6] and [9:12] lose one and two members
    ids = torch.arange(15) // 3
    yield case("nan-reward", with_nan, ids)
    yield case("nan-ignore", with_nan, ids, nan="ignore")
    yield case("nan-ignore-loo-batch", with_nan, None, group_size=3, nan="ignore",
               baseline="loo", normalize="batch-std")
    yield case("nan-ignore-verl-singleton", with_nan, ids, nan="ignore", singleton="reward")
    nan_single = rewards(11)
    nan_single[3] = float("nan")  # the only member of group 1
    yield case("nan-group-of-one", nan_single, uneven)
    yield case("nan-group-of-one-ignore", nan_single, uneven, nan="ignore", singleton="reward")
    yield case("empty", rewards(0), torch.zeros(0, dtype=torch.int64))


def _public_prepare(rewards: Tensor, *, group_size: int | None = None, group_ids: Any = None,
                    options: GroupAdvantagesOptions | None = None,
                    **settings: Any) -> dict[str, Any]:
    chosen = GroupAdvantagesOptions.build(options, settings)
    return _kernel_args(_prepare(rewards, group_size, group_ids, chosen))


def _reference(args: Mapping[str, Any]) -> tuple[Tensor, ...]:
    ids = args["group_ids"]
    if ids is None:
        size = args["group_size"]
        ids = torch.arange(args["rewards"].numel(), device=args["rewards"].device) // size
    return (reference.group_advantages(args["rewards"], ids, options=args["options"]),)


def _opcheck_case(args: dict[str, Any]) -> tuple[Any, tuple[Any, ...]]:
    return torch.ops.rlk.group_advantages.default, SIGNATURE.encode(args)


def _output_meta(rewards: Tensor, *_: Any, **__: Any) -> tuple[Out | None, ...]:
    return (Out(tuple(rewards.shape), torch.float32, rewards.device),)


def _nan_rule(named: Mapping[str, Any], outputs: tuple[Any, ...]) -> tuple[Tensor | bool, ...]:
    # eps = 0 divides a group without spread by its zero std
    return (not kernel_checks.finite(named["rewards"]) or named["options"].eps == 0,)


def _shape_call(shape: Any, dtype: torch.dtype) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if len(shape) != 1:
        raise ValueError(f"takes --shape N; got {shape}")
    return (torch.empty(shape, dtype=dtype, device="meta"),), {"group_size": 1}


GROUP_ADVANTAGES = OpSpec(
    name="group_advantages",
    main_input="rewards",
    prepare=_public_prepare,
    flags=lambda args: (args["group_ids"] is None, args["options"].choices()),
    reference=_reference,
    outputs=lambda result, args: (result,),
    samples=_samples,
    tolerances={torch.float32: Tolerance(atol=1e-5, rtol=1e-5)},
    dtypes=(torch.float32,),
    opcheck_case=_opcheck_case,
    operator=Operator(SIGNATURE, returns="Tensor", kernel_arguments=_kernel_args),
    doc="GRPO / RLOO group advantages",
    native=NativeKernel("rlk.ops.group_advantages.native:forward"),
    output_meta=_output_meta,
    shape_call=_shape_call,
    shape_help="N",
    nan_rule=_nan_rule,
)
