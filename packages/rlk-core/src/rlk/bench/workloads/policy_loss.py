"""`policy-loss`: the small per-token op of a GRPO step.

Its float64 truth comes from the op's spec in rlk-core (`rlk._runtime.spec.specs()`), so
the check follows whatever options the op defines; without a spec the rows still run and
say that nothing was checked.
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

CLIP_LOW, CLIP_HIGH, KL_COEF = 0.2, 0.28, 0.001
F32 = torch.float32


def _spec(op: str) -> Any:
    from rlk._runtime.spec import specs

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


WORKLOADS = (POLICY_LOSS,)
