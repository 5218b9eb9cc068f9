"""`group-advantages`: GRPO advantages of binary (verifiable) rewards, fixed group size."""

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


def adv_case(n: int, g: int) -> Case:
    return Case(f"N={n} G={g}", {"N": n, "G": g}, dtype=F32)


def adv_inputs(case: Case, dtype: torch.dtype, device: torch.device, seed: int,
               backward: bool) -> Inputs:
    n = int(case.dims["N"])
    gen = torch.Generator(device=device).manual_seed(seed)
    rewards = (torch.rand(n, generator=gen, device=device) < 0.4).to(F32)
    return {"rewards": rewards, "group_size": int(case.dims["G"])}


def adv_rlk(backward: bool) -> Call:
    group_advantages = rlk_function("group_advantages")

    def call(x: Inputs) -> Outputs:
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


def adv_reference(x: Inputs, backward: bool) -> dict[str, Tensor]:
    """The first REFERENCE_GROUPS groups only: the float64 reference loops over groups."""
    size = x["group_size"]
    count = min(x["rewards"].shape[0], REFERENCE_GROUPS * size)
    ids = torch.arange(count, device=x["rewards"].device) // size
    return {"advantages": reference.group_advantages(x["rewards"][:count], ids)}


def adv_compare(found: dict[str, Tensor], outputs: Outputs, x: Inputs) -> list[Error]:
    count = found["advantages"].shape[0]
    return [checks.error("advantages", outputs["advantages"][:count], found["advantages"])]


GROUP_ADVANTAGES = Workload(
    name="group-advantages", op="group_advantages", modes=(FORWARD,),
    cases=(adv_case(8192, 16),), smoke_cases=(adv_case(64, 8),),
    inputs=adv_inputs, rlk_call=adv_rlk, reference=adv_reference, compare=adv_compare,
    cost=lambda c, d, b: Cost(c.dims["N"] * 8), peers={"eager": _adv_peer(False),
                                                       "compile": _adv_peer(True)},
    doc="rlk.group_advantages: GRPO (mean baseline, std normalisation), 0/1 rewards")


WORKLOADS = (GROUP_ADVANTAGES,)
