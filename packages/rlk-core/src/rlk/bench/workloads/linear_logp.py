"""`linear-logp`: the LM head and logp fused, forward (old/reference log-probs) and fwd+bwd.

The weight is scaled so that the logits have a standard deviation of about 2.
Forward+backward uses a per-token upstream gradient, the RL case: it is unknown
while the forward runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from rlk.bench import checks, floors, peers
from rlk.bench.workload import (
    FORWARD,
    FORWARD_BACKWARD,
    Blocked,
    Call,
    Case,
    Cost,
    Error,
    Inputs,
    Outputs,
    Peer,
    Workload,
    element_size,
    grads,
    rlk_function,
)
from rlk.ops.linear_logp import reference


def case(n: int, h: int, v: int) -> Case:
    return Case(f"N={n} H={h} V={v}", {"N": n, "H": h, "V": v})


def make_inputs(case: Case, dtype: torch.dtype, device: torch.device, seed: int,
                backward: bool) -> Inputs:
    n, h, v = (int(case.dims[k]) for k in ("N", "H", "V"))
    gen = torch.Generator(device=device).manual_seed(seed)
    hidden = torch.randn(n, h, generator=gen, device=device, dtype=dtype)
    weight = torch.randn(v, h, generator=gen, device=device, dtype=dtype).mul_(2.0 / h**0.5)
    return {
        "hidden": hidden.requires_grad_(backward),
        "weight": weight.requires_grad_(backward),
        "tokens": torch.randint(0, v, (n,), generator=gen, device=device),
        "grad_logp": torch.randn(n, generator=gen, device=device),
        "check_rows": checks.check_rows(n, device, seed=0),
    }


def cost(case: Case, dtype: torch.dtype, backward: bool) -> Cost:
    """One GEMM forward; four with backward (logits, recomputed logits, grad hidden, grad weight).

    Three would do if the [N, V] logits were kept, which is what the op exists to avoid.
    """
    n, h, v = case.dims["N"], case.dims["H"], case.dims["V"]
    size = element_size(dtype)
    operands = (n * h + v * h) * size
    gemm = 2.0 * n * h * v
    if backward:
        return Cost(3 * operands + n * 16, 4 * gemm)
    return Cost(operands + n * 12, gemm)


def expected(x: Inputs, backward: bool) -> dict[str, Tensor]:
    rows = x["check_rows"]
    hidden, weight, tokens = x["hidden"].detach()[rows], x["weight"].detach(), x["tokens"][rows]
    found = {"logp": reference.linear_logp_entropy(hidden, weight, tokens)[0]}
    if backward:
        grad_hidden, grad_weight, _ = reference.linear_logp_entropy_grad(
            hidden, weight, tokens, x["grad_logp"][rows], None)
        found["grad_hidden"] = grad_hidden
        if rows.numel() == x["hidden"].shape[0]:  # the weight gradient needs every row
            found["grad_weight"] = grad_weight
    return found


def compare(found: dict[str, Tensor], outputs: Outputs, x: Inputs) -> list[Error]:
    whole = {k: v for k, v in found.items() if k == "grad_weight"}
    per_row = {k: v for k, v in found.items() if k != "grad_weight"}
    return (checks.compare_rows(per_row, outputs, x["check_rows"])
            + checks.compare_rows(whole, outputs, None))


def _wrap(function: Callable[[Tensor, Tensor, Tensor], Tensor], backward: bool) -> Call:
    def call(x: Inputs) -> Outputs:
        logp = function(x["hidden"], x["weight"], x["tokens"])
        outputs = {"logp": logp.detach()}
        if backward:
            outputs["grad_hidden"], outputs["grad_weight"] = grads(
                logp, (x["grad_logp"],), (x["hidden"], x["weight"]))
        return outputs

    return call


def rlk_call(backward: bool) -> Call:
    return _wrap(rlk_function("linear_logp"), backward)


def eager(hidden: Tensor, weight: Tensor, tokens: Tensor) -> Tensor:
    log_probs = torch.log_softmax((hidden @ weight.t()).float(), dim=-1)
    return log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def _package_peer(peer: str, module: str, attr: str) -> Callable[[Case, bool, torch.device], Call]:
    def build(case: Case, backward: bool, device: torch.device) -> Call:
        loss = peers.load(peer, module, attr, device)

        def logp(hidden: Tensor, weight: Tensor, tokens: Tensor) -> Any:
            return -loss(hidden, weight, tokens, reduction="none")

        return _wrap(logp, backward)

    return build


def _quack(case: Case, backward: bool, device: torch.device) -> Call:
    """QuACK's LM-head GEMM with the LSE and target-logit epilogue (the logits are never
    stored): logp = target logit - lse. Forward only: its fused linear cross entropy with a
    backward returns a mean or sum, not a loss per token for an upstream gradient."""
    if backward:
        raise Blocked("QuACK's fused linear cross entropy reduces the loss to a mean or sum: "
                      "no per-token upstream gradient (RL's case)")
    lse_target = peers.load("quack", "quack.epilogue.library", "lse_target_epi", device)

    def call(x: Inputs) -> Outputs:
        found = lse_target(x["hidden"], x["weight"].mT, store_d=False, target=x["tokens"])
        return {"logp": found["target_logit"] - found["lse"]}

    return call


PEERS = {
    "eager": Peer("eager", lambda c, b, d: _wrap(eager, b)),
    "compile": Peer("compile", lambda c, b, d: _wrap(peers.compiled(eager), b)),
    "liger": Peer("liger", _package_peer("liger", "liger_kernel.transformers.functional",
                                         "liger_fused_linear_cross_entropy"),
                  note="reduction='none' recomputes the gradients in the backward"),
    "cce": Peer("cce", _package_peer("cce", "cut_cross_entropy", "linear_cross_entropy"),
                note="default filter_eps: small gradient entries are skipped"),
    "quack": Peer("quack", _quack, note="one GEMM with an LSE and target-logit epilogue"),
    "cublas": floors.gemm_floor(lambda case: 2),  # the backward recomputes the logits
}

LINEAR_LOGP = Workload(
    name="linear-logp", op="linear_logp", modes=(FORWARD, FORWARD_BACKWARD),
    cases=(case(8192, 4096, 151936), case(8192, 2048, 32768), case(8192, 4096, 50257)),
    smoke_cases=(case(40, 32, 300),), inputs=make_inputs, rlk_call=rlk_call,
    reference=expected, compare=compare, cost=cost, peers=PEERS,
    doc="rlk.linear_logp: hidden @ weight.T and logp without the [N, V] logits")
WORKLOADS = (LINEAR_LOGP,)
