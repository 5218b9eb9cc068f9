"""`group-advantages`: GRPO advantages of binary (verifiable) rewards, fixed group size.

`group-advantages-sweep`: every group size three ways, `group_size=` ("size"), group ids in
order ("ids") and the same ids and rewards shuffled ("shuffled"), each beside the eager GRPO
of its own form: the reshape for consecutive groups (the fastest eager form there is), for
ids the one a user writes over group labels (torch.unique, then index_add sums).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlk.bench import checks, peers
from rlk.bench.workload import (
    FORWARD,
    Call,
    Case,
    Cost,
    Error,
    Inputs,
    Outputs,
    Peer,
    Workload,
    rlk_function,
)
from rlk.ops.group_advantages import reference

F32 = torch.float32


REFERENCE_GROUPS = 64
PATHS = ("size", "ids", "shuffled")
SWEEP_SIZES = (2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096)


def adv_case(n: int, g: int) -> Case:
    return Case(f"N={n} G={g}", {"N": n, "G": g}, dtype=F32)


def sweep_case(n: int, g: int, path: str) -> Case:
    return Case(f"N={n} G={g} {path}", {"N": n, "G": g, "path": PATHS.index(path)}, dtype=F32)


def adv_inputs(case: Case, dtype: torch.dtype, device: torch.device, seed: int,
               backward: bool) -> Inputs:
    """Rewards and group size; with a sweep's ids path, `group_ids` too, and for shuffled
    ones `unshuffle`, the permutation that puts rewards and outputs back in group order."""
    n, size = int(case.dims["N"]), int(case.dims["G"])
    gen = torch.Generator(device=device).manual_seed(seed)
    rewards = (torch.rand(n, generator=gen, device=device) < 0.4).to(F32)
    x: Inputs = {"rewards": rewards, "group_size": size}
    path = PATHS[int(case.dims.get("path", 0))]
    if path != "size":
        x["group_ids"] = torch.arange(n, device=device) // size
    if path == "shuffled":
        perm = torch.randperm(n, generator=gen, device=device)
        x.update(rewards=rewards[perm], group_ids=x["group_ids"][perm],
                 unshuffle=torch.argsort(perm))
    return x


def adv_rlk(backward: bool) -> Call:
    group_advantages = rlk_function("group_advantages")

    def call(x: Inputs) -> Outputs:
        if "group_ids" in x:
            return {"advantages": group_advantages(x["rewards"], group_ids=x["group_ids"])}
        return {"advantages": group_advantages(x["rewards"], group_size=x["group_size"])}

    return call


def eager_advantages(rewards: Tensor, group_size: int) -> Tensor:
    groups = rewards.view(-1, group_size)
    centred = groups - groups.mean(-1, keepdim=True)
    return (centred / (groups.std(-1, keepdim=True) + 1e-6)).view(-1)


def _adv_peer(compile_it: bool) -> Peer:
    def build(case: Case, backward: bool, device: torch.device) -> Call:
        function = peers.compiled(eager_advantages) if compile_it else eager_advantages
        return lambda x: {"advantages": function(x["rewards"], x["group_size"])}

    return Peer("compile" if compile_it else "eager", build)


def eager_ids_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """GRPO advantages over group labels in any order, as a user writes them in torch."""
    labels, inverse = torch.unique(group_ids, return_inverse=True)
    zeros = rewards.new_zeros(labels.numel())
    counts = zeros.index_add(0, inverse, torch.ones_like(rewards))
    centred = rewards - (zeros.index_add(0, inverse, rewards) / counts)[inverse]
    variance = zeros.index_add(0, inverse, centred * centred) / (counts - 1)
    return centred / (variance.sqrt()[inverse] + 1e-6)


def _sweep_peer(case: Case, backward: bool, device: torch.device) -> Call:
    """The eager peer of the case's own form."""
    if PATHS[int(case.dims["path"])] == "size":
        return lambda x: {"advantages": eager_advantages(x["rewards"], x["group_size"])}
    return lambda x: {"advantages": eager_ids_advantages(x["rewards"], x["group_ids"])}


def _in_group_order(x: Inputs, values: Tensor) -> Tensor:
    return values[x["unshuffle"]] if "unshuffle" in x else values


def adv_reference(x: Inputs, backward: bool) -> dict[str, Tensor]:
    """The first REFERENCE_GROUPS groups only: the float64 reference loops over groups."""
    size = x["group_size"]
    rewards = _in_group_order(x, x["rewards"])
    count = min(rewards.shape[0], REFERENCE_GROUPS * size)
    ids = torch.arange(count, device=rewards.device) // size
    return {"advantages": reference.group_advantages(rewards[:count], ids)}


def adv_compare(found: dict[str, Tensor], outputs: Outputs, x: Inputs) -> list[Error]:
    count = found["advantages"].shape[0]
    advantages = _in_group_order(x, outputs["advantages"])
    return [checks.error("advantages", advantages[:count], found["advantages"])]


GROUP_ADVANTAGES = Workload(
    name="group-advantages", op="group_advantages", modes=(FORWARD,),
    cases=(adv_case(8192, 16),), smoke_cases=(adv_case(64, 8),),
    inputs=adv_inputs, rlk_call=adv_rlk, reference=adv_reference, compare=adv_compare,
    cost=lambda c, d, b: Cost(c.dims["N"] * 8), peers={"eager": _adv_peer(False),
                                                       "compile": _adv_peer(True)},
    doc="rlk.group_advantages: GRPO (mean baseline, std normalisation), 0/1 rewards")


GROUP_ADVANTAGES_SWEEP = Workload(
    name="group-advantages-sweep", op="group_advantages", modes=(FORWARD,),
    cases=tuple(sweep_case(n, g, path) for n in (8192, 65536) for g in SWEEP_SIZES
                for path in PATHS),
    smoke_cases=tuple(sweep_case(64, g, path) for g in (2, 64) for path in PATHS),
    inputs=adv_inputs, rlk_call=adv_rlk, reference=adv_reference, compare=adv_compare,
    cost=lambda c, d, b: Cost(c.dims["N"] * (16 if c.dims["path"] else 8)),
    peers={"eager": Peer("eager", _sweep_peer)},
    doc="rlk.group_advantages at every group size, by size, ids and shuffled ids")


WORKLOADS = (GROUP_ADVANTAGES, GROUP_ADVANTAGES_SWEEP)
