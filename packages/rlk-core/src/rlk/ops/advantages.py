"""`group_advantages`: GRPO / RLOO / Dr. GRPO advantages from per-sample rewards."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from rlk import reference
from rlk.ops import validate
from rlk.ops.contract import Out
from rlk.ops.spec import NativeKernel, OpSpec, Sample, Tolerance

NORMALIZE = ("std", "none")
BASELINES = ("mean", "loo")


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}")
    return str(value)


def dense_ids(rewards: Tensor, group_ids: Tensor | None, group_size: int) -> tuple[Tensor, int]:
    """Group ids renumbered 0..G-1 (any integer labels are allowed), and G."""
    if group_ids is None:
        count = rewards.shape[0]
        ids = torch.arange(count, device=rewards.device) // group_size
        return ids, count // group_size
    labels, ids = torch.unique(group_ids, return_inverse=True)
    return ids.to(torch.int64), int(labels.numel())


def _prepare(rewards: Tensor, group_size: int | None, group_ids: Tensor | None,
             normalize: str, baseline: str, eps: float) -> dict[str, Any]:
    """Validate the public arguments (no device sync); rewards come back as float32."""
    validate.tensor("rewards", rewards, (*validate.FLOATS, torch.float64))
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
    if group_ids is not None:
        validate.tensor("group_ids", group_ids, validate.INDICES)
        validate.shape("group_ids", group_ids, tuple(rewards.shape), " (one label per reward)")
        validate.same_device("group_ids", group_ids, rewards, "rewards")
    return {
        "rewards": rewards.to(torch.float32),
        "group_ids": group_ids,
        "group_size": size,
        "normalize": _choice("normalize", normalize, NORMALIZE),
        "baseline": _choice("baseline", baseline, BASELINES),
        "eps": validate.positive_scalar("eps", eps, allow_zero=True),
    }


def _kernel_args(rewards: Tensor, group_ids: Tensor | None, group_size: int, normalize: str,
                 baseline: str, eps: float) -> dict[str, Any]:
    ids, count = dense_ids(rewards, group_ids, group_size)
    return {"rewards": rewards, "group_ids": ids, "num_groups": count, "normalize": normalize,
            "baseline": baseline, "eps": eps}


@torch.library.custom_op("rlk::group_advantages", mutates_args=())
def _group_advantages_op(rewards: Tensor, group_ids: Tensor | None, group_size: int,
                         normalize: str, baseline: str, eps: float) -> Tensor:
    args = _kernel_args(rewards, group_ids, group_size, normalize, baseline, eps)
    return GROUP_ADVANTAGES.kernel(args).forward(**args)


@_group_advantages_op.register_fake
def _(rewards, group_ids, group_size, normalize, baseline, eps):
    return torch.empty_like(rewards)


def group_advantages(
    rewards: Tensor,
    *,
    group_size: int | None = None,
    group_ids: Tensor | None = None,
    normalize: str = "std",
    baseline: str = "mean",
    eps: float = 1e-6,
) -> Tensor:
    """Per-sample advantages: reward minus its group's baseline, optionally over the group std.

    Groups are consecutive runs of `group_size` rewards, or the rewards sharing a
    label in `group_ids` (any integers). baseline "mean" (GRPO) or "loo" (RLOO: the
    mean of the other members); normalize "std" (sample std, plus eps) or "none"
    (Dr. GRPO). Groups of one and constant groups give 0, never NaN. Returns float32
    `[N]`; not differentiable.
    """
    args = _prepare(rewards, group_size, group_ids, normalize, baseline, eps)
    return _group_advantages_op(args["rewards"].detach(), args["group_ids"], args["group_size"],
                                args["normalize"], args["baseline"], args["eps"])


# ---------------------------------------------------------------------------
# conformance samples and the spec


def _samples(device: torch.device, dtype: torch.dtype) -> Iterator[Sample]:
    gen = torch.Generator().manual_seed(77)

    def case(name: str, rewards: Tensor, ids: Tensor, **options: Any) -> Sample:
        args = {"rewards": rewards.to(device), "group_ids": ids.to(device),
                "num_groups": int(ids.max()) + 1 if ids.numel() else 0,
                "normalize": "std", "baseline": "mean", "eps": 1e-6}
        args.update(options)
        return Sample(name, args, check_backward=False)

    def rewards(count: int) -> Tensor:
        return torch.randn(count, generator=gen)

    fixed = torch.arange(24) // 4
    yield case("grpo", rewards(24), fixed)
    yield case("rloo", rewards(24), fixed, baseline="loo", normalize="none")
    yield case("rloo-std", rewards(24), fixed, baseline="loo")
    yield case("dr-grpo", rewards(24), fixed, normalize="none")
    yield case("shuffled-ids", rewards(30), torch.randperm(30, generator=gen) % 7)
    uneven = torch.tensor([0, 0, 0, 1, 2, 2, 3, 3, 3, 3, 3])
    yield case("groups-of-one", rewards(11), uneven)
    yield case("groups-of-one-loo", rewards(11), uneven, baseline="loo")
    binary = (torch.rand(16, generator=gen) > 0.5).float()
    binary[:4] = 1.0
    binary[4:8] = 0.0
    yield case("constant-groups", binary, torch.arange(16) // 4)
    yield case("constant-groups-eps-zero", binary, torch.arange(16) // 4, eps=0.0)
    with_nan = rewards(12)
    with_nan[5] = float("nan")
    yield case("nan-reward", with_nan, torch.arange(12) // 3)
    yield case("empty", rewards(0), torch.zeros(0, dtype=torch.int64))


def _public_prepare(rewards: Tensor, *, group_size: int | None = None,
                    group_ids: Tensor | None = None, normalize: str = "std",
                    baseline: str = "mean", eps: float = 1e-6) -> dict[str, Any]:
    args = _prepare(rewards, group_size, group_ids, normalize, baseline, eps)
    return _kernel_args(args.pop("rewards"), args.pop("group_ids"), args.pop("group_size"),
                        **args)


def _reference(args: Mapping[str, Any]) -> tuple[Tensor, ...]:
    return (reference.group_advantages(args["rewards"], args["group_ids"],
                                       normalize=args["normalize"], baseline=args["baseline"],
                                       eps=args["eps"]),)


def _opcheck_case(args: dict[str, Any]) -> tuple[Any, tuple[Any, ...]]:
    return torch.ops.rlk.group_advantages.default, (
        args["rewards"], args["group_ids"], 0, args["normalize"], args["baseline"], args["eps"]
    )


def _output_meta(rewards: Tensor, *_: Any, **__: Any) -> tuple[Out | None, ...]:
    return (Out(tuple(rewards.shape), torch.float32, rewards.device),)


def _shape_call(shape: Any, dtype: torch.dtype) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if len(shape) != 1:
        raise ValueError(f"takes --shape N; got {shape}")
    return (torch.empty(shape, dtype=dtype, device="meta"),), {"group_size": 1}


GROUP_ADVANTAGES = OpSpec(
    name="group_advantages",
    main_input="rewards",
    prepare=_public_prepare,
    flags=lambda args: (args["normalize"], args["baseline"]),
    reference=_reference,
    outputs=lambda result, args: (result,),
    samples=_samples,
    tolerances={torch.float32: Tolerance(atol=1e-5, rtol=1e-5)},
    dtypes=(torch.float32,),
    opcheck_case=_opcheck_case,
    doc="GRPO / RLOO group advantages",
    native=NativeKernel("rlk.native.advantages:forward"),
    output_meta=_output_meta,
    shape_call=_shape_call,
    shape_help="N",
)
