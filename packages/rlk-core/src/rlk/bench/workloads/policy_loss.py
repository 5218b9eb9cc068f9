"""`policy-loss` and `group-advantages`: the small per-token and per-sample ops of a GRPO step.

Their float64 truth comes from the op's spec in rlk-core (`rlk.ops.specs()`), so the
check follows whatever options the op defines; without a spec the rows still run
and say that nothing was checked.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from rlk.bench import checks, peers
from rlk.bench.workload import (
    FORWARD,
    FORWARD_BACKWARD,
    Call,
    Case,
    Cost,
    Error,
    Inputs,
    Outputs,
    Peer,
    Workload,
    grads,
    rlk_function,
)
from rlk.ops.policy_loss import reference

CLIP_LOW, CLIP_HIGH, KL_COEF = 0.2, 0.28, 0.001
F32 = torch.float32


def _spec(op: str) -> Any:
    from rlk.op_table import specs

    return specs().get(op)


# ---------------------------------------------------------------------------
# policy-loss: DAPO-style clip-higher, k3 KL to a reference policy, token-mean


def loss_case(b: int, t: int) -> Case:
    return Case(f"B={b} T={t}", {"B": b, "T": t}, dtype=F32)


def loss_inputs(case: Case, dtype: torch.dtype, device: torch.device, seed: int,
                backward: bool) -> Inputs:
    b, t = int(case.dims["B"]), int(case.dims["T"])
    gen = torch.Generator(device=device).manual_seed(seed)

    def noise(scale: float) -> Tensor:
        return torch.randn(b, t, generator=gen, device=device, dtype=F32) * scale

    logp = noise(1.0).abs().neg()
    lengths = torch.randint(1, t + 1, (b, 1), generator=gen, device=device)
    mask = (torch.arange(t, device=device) < lengths).to(F32)
    return {
        "logp": logp.requires_grad_(backward),
        "old_logp": logp.detach() + noise(0.1),
        "ref_logp": logp.detach() + noise(0.3),
        "advantages": torch.randn(b, generator=gen, device=device, dtype=F32),
        "mask": mask,
    }


OPTIONS = {"clip_low": CLIP_LOW, "clip_high": CLIP_HIGH, "kl_coef": KL_COEF,
           "kl_estimator": "k3", "agg": "token-mean"}


def loss_rlk(backward: bool) -> Call:
    policy_loss = rlk_function("policy_loss")

    def call(x: Inputs) -> Outputs:
        loss, _ = policy_loss(x["logp"], x["old_logp"], x["advantages"], x["mask"],
                              ref_logp=x["ref_logp"], **OPTIONS)
        return _loss_outputs(loss, x, backward)

    return call


def _loss_outputs(loss: Tensor, x: Inputs, backward: bool) -> Outputs:
    outputs = {"loss": loss.detach()}
    if backward:
        (outputs["grad_logp"],) = grads(loss, (torch.ones_like(loss),), (x["logp"],))
    return outputs


def eager_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
               ref_logp: Tensor) -> Tensor:
    ratio = torch.exp(logp - old_logp)
    adv = advantages.unsqueeze(-1)
    clipped = ratio.clamp(1.0 - CLIP_LOW, 1.0 + CLIP_HIGH)
    surrogate = torch.maximum(-adv * ratio, -adv * clipped)
    delta = ref_logp - logp
    kl = torch.exp(delta) - delta - 1.0
    per_token = surrogate + KL_COEF * kl
    return (per_token * mask).sum() / mask.sum().clamp_min(1.0)


def _loss_peer(compile_it: bool) -> Peer:
    def build(case: Case, backward: bool, device: torch.device) -> Call:
        function = peers.compiled(eager_loss) if compile_it else eager_loss

        def call(x: Inputs) -> Outputs:
            loss = function(x["logp"], x["old_logp"], x["advantages"], x["mask"], x["ref_logp"])
            return _loss_outputs(loss, x, backward)

        return call

    return Peer("compile" if compile_it else "eager", build)


def loss_reference(x: Inputs, backward: bool) -> dict[str, Tensor] | None:
    """Float64 loss (and its gradient w.r.t. logp) from the spec's reference."""
    spec = _spec("policy_loss")
    if spec is None:
        return None
    logp = x["logp"].detach()
    args = spec.prepare(logp, x["old_logp"], x["advantages"], x["mask"],
                        ref_logp=x["ref_logp"], **OPTIONS)
    leaf = logp.to(torch.float64).requires_grad_(backward)
    args[spec.main_input] = leaf
    with torch.enable_grad():
        loss = spec.reference(args)[0]
        found = {"loss": loss.detach()}
        if backward and loss.requires_grad:
            (found["grad_logp"],) = torch.autograd.grad(loss, leaf)
    return found


def loss_compare(found: dict[str, Tensor] | None, outputs: Outputs, x: Inputs) -> list[Error]:
    return [] if found is None else checks.compare_rows(found, outputs, None)


def loss_cost(case: Case, dtype: torch.dtype, backward: bool) -> Cost:
    tokens = case.dims["B"] * case.dims["T"]
    return Cost(tokens * 4 * (4 + (2 if backward else 0)))


POLICY_LOSS = Workload(
    name="policy-loss", op="policy_loss", modes=(FORWARD, FORWARD_BACKWARD),
    cases=(loss_case(64, 4096),), smoke_cases=(loss_case(4, 24),),
    inputs=loss_inputs, rlk_call=loss_rlk, reference=loss_reference, compare=loss_compare,
    cost=loss_cost, peers={"eager": _loss_peer(False), "compile": _loss_peer(True)},
    doc="rlk.policy_loss: clip-higher (0.2/0.28), k3 KL (0.001), token-mean, [B] advantages")


# ---------------------------------------------------------------------------
# group-advantages: GRPO, binary (verifiable) rewards, fixed group size

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
WORKLOADS = (POLICY_LOSS, GROUP_ADVANTAGES)
