"""`linear-policy-loss`: hidden states to the GRPO loss (LM head, logp, clipped surrogate, k3 KL).

Token-level loss (clip 0.2/0.28, k3 KL to a reference policy, token mean) and, in the
cases marked GSPO=1, GSPO's sequence-level ratio (clip 3e-4/4e-4, sequence mean of token
means); bf16 inputs, logits of standard deviation about 2. Forward+backward is the training
step's LM head and loss; the gradients are those of the loss itself (upstream gradient 1).

The float64 truth is exact for every row (logits in float64, chunk by chunk), so the loss
and per-token logp are checked in full; the hidden gradient on `check_rows`, the weight
gradient when every row is checked (the smoke shapes).
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
    Call,
    Case,
    Cost,
    Error,
    Inputs,
    Outputs,
    Peer,
    Variant,
    Workload,
    element_size,
    rlk_function,
)
from rlk.ops.linear_logp import reference
from rlk.ops.policy_loss import reference as policy_loss_reference

TOKEN_LEVEL: dict[str, Any] = {"clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.04,
                               "kl_estimator": "k3", "agg": "token-mean"}
SEQUENCE_LEVEL: dict[str, Any] = {"clip_low": 3e-4, "clip_high": 4e-4, "kl_coef": 0.04,
                                  "kl_estimator": "k3", "ratio_level": "sequence",
                                  "agg": "seq-mean-token-mean"}
_REFERENCE_ROWS = 512  # float64 logits rows at a time in the reference


def case(b: int, t: int, h: int, v: int, gspo: bool = False) -> Case:
    label = f"B={b} T={t} H={h} V={v}" + (" GSPO" if gspo else "")
    return Case(label, {"B": b, "T": t, "H": h, "V": v, "GSPO": int(gspo)})


def make_inputs(case: Case, dtype: torch.dtype, device: torch.device, seed: int,
                backward: bool) -> Inputs:
    b, t, h, v = (int(case.dims[k]) for k in ("B", "T", "H", "V"))
    gen = torch.Generator(device=device).manual_seed(seed)

    def noise(scale: float) -> Tensor:
        return torch.randn(b, t, generator=gen, device=device) * scale

    hidden = torch.randn(b, t, h, generator=gen, device=device, dtype=dtype)
    weight = torch.randn(v, h, generator=gen, device=device, dtype=dtype).mul_(2.0 / h**0.5)
    # old and reference log-probs near typical token log-probs (logits of std 2 over V)
    typical = -torch.log(torch.tensor(float(v))) + noise(1.5)
    lengths = torch.randint(t // 2, t + 1, (b, 1), generator=gen, device=device)
    return {
        "hidden": hidden.requires_grad_(backward),
        "weight": weight.requires_grad_(backward),
        "tokens": torch.randint(0, v, (b, t), generator=gen, device=device),
        "old_logp": typical,
        "ref_logp": typical + noise(0.3),
        "advantages": torch.randn(b, generator=gen, device=device),
        "mask": (torch.arange(t, device=device) < lengths).to(torch.float32),
        "check_rows": checks.check_rows(b * t, device, seed=0),
        "options": SEQUENCE_LEVEL if case.dims["GSPO"] else TOKEN_LEVEL,
    }


def cost(case: Case, dtype: torch.dtype, backward: bool) -> Cost:
    """One GEMM forward; three with backward (logits once, grad hidden, grad weight), four
    for GSPO (its ratio needs every token of a sequence before any gradient)."""
    n = case.dims["B"] * case.dims["T"]
    h, v = case.dims["H"], case.dims["V"]
    operands = (n * h + v * h) * element_size(dtype)
    gemm = 2.0 * n * h * v
    if backward:
        return Cost(3 * operands + n * 24, (4 if case.dims["GSPO"] else 3) * gemm)
    return Cost(operands + n * 20, gemm)


def _policy_loss64(logp: Tensor, x: Inputs) -> Tensor:
    from rlk.ops.policy_loss.options import PolicyLossOptions

    loss, _ = policy_loss_reference.policy_loss(logp, x["old_logp"], x["advantages"], x["mask"],
                                    ref_logp=x["ref_logp"],
                                    options=PolicyLossOptions(**x["options"]))
    return loss


def expected(x: Inputs, backward: bool) -> dict[str, Tensor]:
    """Float64 loss and logp of every row; gradients of the loss on the checked rows."""
    hidden = x["hidden"].detach().flatten(0, 1)
    weight, tokens = x["weight"].detach(), x["tokens"].reshape(-1)
    logp = torch.cat([
        reference.linear_logp_entropy(hidden[i:i + _REFERENCE_ROWS], weight,
                                      tokens[i:i + _REFERENCE_ROWS])[0]
        for i in range(0, hidden.shape[0], _REFERENCE_ROWS)])
    leaf = logp.view(x["tokens"].shape).requires_grad_(backward)
    with torch.enable_grad():
        loss = _policy_loss64(leaf, x)
        found = {"loss": loss.detach(), "logp": logp}
        if not backward:
            return found
        (grad_logp,) = torch.autograd.grad(loss, leaf)
    rows = x["check_rows"]
    grad_hidden, grad_weight, _ = reference.linear_logp_entropy_grad(
        hidden[rows], weight, tokens[rows], grad_logp.reshape(-1)[rows], None)
    found["grad_hidden"] = grad_hidden
    if rows.numel() == hidden.shape[0]:
        found["grad_weight"] = grad_weight
    return found


def compare(found: dict[str, Tensor], outputs: Outputs, x: Inputs) -> list[Error]:
    """Errors per output; logp where the mask is set (rlk reports 0 elsewhere, peers logp)."""
    real = x["mask"].reshape(-1) != 0
    masked = dict(outputs)
    if "logp" in outputs:
        masked["logp"] = torch.where(real, outputs["logp"], 0.0)
    found = dict(found, logp=torch.where(real, found["logp"], 0.0))
    per_row = {k: v for k, v in found.items() if k == "grad_hidden"}
    whole = {k: v for k, v in found.items() if k != "grad_hidden"}
    return (checks.compare_rows(per_row, masked, x["check_rows"])
            + checks.compare_rows(whole, masked, None))


def _outputs(loss: Tensor, logp: Tensor, x: Inputs, backward: bool) -> Outputs:
    outputs = {"loss": loss.detach(), "logp": logp.detach().reshape(-1)}
    if backward:
        grad_hidden, grad_weight = torch.autograd.grad(loss, (x["hidden"], x["weight"]))
        outputs["grad_hidden"] = grad_hidden.flatten(0, 1)
        outputs["grad_weight"] = grad_weight
    return outputs


def rlk_call(backward: bool) -> Call:
    linear_policy_loss = rlk_function("linear_policy_loss")

    def call(x: Inputs) -> Outputs:
        loss, metrics = linear_policy_loss(x["hidden"], x["weight"], x["tokens"], x["old_logp"],
                                           x["advantages"], x["mask"], ref_logp=x["ref_logp"],
                                           **x["options"])
        return _outputs(loss, metrics["logp"], x, backward)

    return call


def _unfused(case: Case, backward: bool, device: torch.device) -> Call:
    """rlk.linear_logp then rlk.policy_loss: the backward recomputes the logits (4 GEMMs)."""
    linear_logp, policy_loss = rlk_function("linear_logp"), rlk_function("policy_loss")

    def call(x: Inputs) -> Outputs:
        logp = linear_logp(x["hidden"], x["weight"], x["tokens"])
        loss, _ = policy_loss(logp.view(x["tokens"].shape), x["old_logp"], x["advantages"],
                              x["mask"], ref_logp=x["ref_logp"], **x["options"])
        return _outputs(loss, logp, x, backward)

    return call


def eager(hidden: Tensor, weight: Tensor, tokens: Tensor, old_logp: Tensor, advantages: Tensor,
          mask: Tensor, ref_logp: Tensor, sequence: bool) -> tuple[Tensor, Tensor]:
    """The loss as trainers write it: full logits, float32 log-softmax, the clipped surrogate."""
    options = SEQUENCE_LEVEL if sequence else TOKEN_LEVEL
    log_probs = torch.log_softmax((hidden @ weight.t()).float(), dim=-1)
    logp = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    log_ratio = logp - old_logp
    lengths = mask.sum(-1, keepdim=True).clamp_min(1.0)
    if sequence:
        log_ratio = ((log_ratio * mask).sum(-1, keepdim=True) / lengths).expand_as(logp)
    ratio = torch.exp(log_ratio)
    adv = advantages.unsqueeze(-1)
    clipped = ratio.clamp(1.0 - options["clip_low"], 1.0 + options["clip_high"])
    surrogate = torch.maximum(-adv * ratio, -adv * clipped)
    delta = ref_logp - logp
    per_token = (surrogate + options["kl_coef"] * (torch.exp(delta) - delta - 1.0)) * mask
    if sequence:
        nonempty = (mask.sum(-1) > 0).sum().clamp_min(1)
        return (per_token.sum(-1) / lengths.squeeze(-1)).sum() / nonempty, logp
    return per_token.sum() / mask.sum().clamp_min(1.0), logp


def _eager_peer(compile_it: bool) -> Peer:
    def build(case: Case, backward: bool, device: torch.device) -> Call:
        function: Callable[..., Any] = peers.compiled(eager) if compile_it else eager

        def call(x: Inputs) -> Outputs:
            loss, logp = function(x["hidden"], x["weight"], x["tokens"], x["old_logp"],
                                  x["advantages"], x["mask"], x["ref_logp"],
                                  bool(case.dims["GSPO"]))
            return _outputs(loss, logp, x, backward)

        return call

    return Peer("compile" if compile_it else "eager", build)


def _liger(case: Case, backward: bool, device: torch.device) -> Call:
    """LigerFusedLinearGRPOLoss at its default chunk_size 1: loss_type "bnpo" (the token
    mean), or "grpo" (the sequence mean of token means) at the sequence level for GSPO."""
    loss_class = peers.load("liger", "liger_kernel.chunked_loss", "LigerFusedLinearGRPOLoss",
                            device)
    sequence = bool(case.dims["GSPO"])
    options = SEQUENCE_LEVEL if sequence else TOKEN_LEVEL
    loss_fn = loss_class(beta=options["kl_coef"], epsilon_low=options["clip_low"],
                         epsilon_high=options["clip_high"], use_ref_model=True, chunk_size=1,
                         loss_type="grpo" if sequence else "bnpo",
                         importance_sampling_level="sequence" if sequence else "token")

    def call(x: Inputs) -> Outputs:
        loss, _ = loss_fn(x["hidden"], x["weight"], x["tokens"], x["mask"], x["advantages"],
                          ref_per_token_logps=x["ref_logp"], old_per_token_logps=x["old_logp"])
        outputs = {"loss": loss.detach()}
        if backward:
            grad_hidden, grad_weight = torch.autograd.grad(loss, (x["hidden"], x["weight"]))
            outputs["grad_hidden"] = grad_hidden.flatten(0, 1)
            outputs["grad_weight"] = grad_weight
        return outputs

    return call


PEERS = {
    "unfused": Peer("unfused", _unfused, note="rlk.linear_logp + rlk.policy_loss: 4 GEMMs"),
    "eager": _eager_peer(False),
    "compile": _eager_peer(True),
    "liger": Peer("liger", _liger, note="LigerFusedLinearGRPOLoss, chunk_size=1; 'grpo' "
                  "divides by all rows, rlk's GSPO mean by non-empty ones (same here)"),
    "cublas": floors.gemm_floor(lambda case: 2 if case.dims["GSPO"] else 1),
}

# rlk-cuda's chunk budget (default 960 MiB) halved and doubled: what the default trades
CHUNK_BUDGETS = tuple(Variant("cuda", f"chunk-{mb}mb", {"RLK_CUDA_CHUNK_MB": str(mb)})
                      for mb in (480, 1920))

LINEAR_POLICY_LOSS = Workload(
    name="linear-policy-loss", op="linear_policy_loss", modes=(FORWARD, FORWARD_BACKWARD),
    cases=(case(16, 1024, 4096, 128256), case(8, 1024, 4096, 151936),
           case(16, 1024, 4096, 128256, gspo=True)),
    smoke_cases=(case(2, 20, 32, 300), case(2, 20, 32, 300, gspo=True)), inputs=make_inputs,
    rlk_call=rlk_call, reference=expected, compare=compare, cost=cost, peers=PEERS,
    doc="rlk.linear_policy_loss: LM head + GRPO loss (clip 0.2/0.28, k3 KL 0.04, token mean); "
        "GSPO (sequence ratio, clip 3e-4/4e-4)")
WORKLOADS = (LINEAR_POLICY_LOSS,)
