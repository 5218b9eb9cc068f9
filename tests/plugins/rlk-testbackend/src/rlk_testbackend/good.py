"""A working third-party backend: logp/logp_entropy computed row by row in float64.

Row by row makes it batch invariant by construction, so the conformance kit's
batch-invariance check runs against a real claim on CPU.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from rlk.backend import hookimpl, one_token_per_row

RLK_PLUGIN_API = "2.0"


def probe(device: torch.device) -> str | None:
    if os.environ.get("RLK_TESTBACKEND") != "1":
        return "test-only backend: set RLK_TESTBACKEND=1 to enable it"
    return None if device.type == "cpu" else f"serves only the CPU, not {device.type}"


def check(*, temperature: float | Tensor, tokens: Tensor, **_: object) -> str | None:
    if isinstance(temperature, Tensor):
        return "per-row temperature is not supported"
    return one_token_per_row(tokens)


def _row(logits: Tensor, token: int, temperature: float, ignore_index: int):
    x = logits.to(torch.float64) / temperature
    lse = torch.logsumexp(x, dim=0)
    log_probs = x - lse
    probs = log_probs.exp()
    entropy = -(probs * torch.where(probs > 0, log_probs, 0.0)).sum()
    if not torch.isfinite(lse):
        return float("nan"), float("nan"), lse
    if token == ignore_index:
        return 0.0, 0.0, lse
    picked = log_probs[token] if 0 <= token < x.shape[0] else float("nan")
    return picked, entropy, lse


def forward(logits: Tensor, tokens: Tensor, temperature: float, ignore_index: int,
            rows: Tensor | None, out: Tensor | None, with_entropy: bool):
    indices = range(logits.shape[0]) if rows is None else rows.tolist()
    count = len(indices)
    logp = out if out is not None else torch.empty(count, dtype=torch.float32)
    entropy = torch.empty(count, dtype=torch.float32) if with_entropy else None
    lse = torch.empty(count, dtype=torch.float64)
    for position, row in enumerate(indices):
        value, ent, row_lse = _row(logits[row], int(tokens[row]), temperature, ignore_index)
        logp[position] = value
        lse[position] = row_lse
        if entropy is not None:
            entropy[position] = ent
    return logp, entropy, lse


def backward(grad_logp: Tensor, grad_entropy: Tensor | None, logits: Tensor, tokens: Tensor,
             temperature: float, ignore_index: int, rows: Tensor | None, lse: Tensor,
             entropy: Tensor | None, inplace: bool) -> Tensor:
    """Row by row in float64: d logp = onehot - p, d entropy = -p (log p + H), over T."""
    indices = list(range(logits.shape[0])) if rows is None else rows.tolist()
    grad = torch.zeros(logits.shape, dtype=torch.float64)
    for position, row in enumerate(indices):
        token = int(tokens[row])
        if token == ignore_index:
            continue
        log_probs = torch.log_softmax(logits[row].to(torch.float64) / temperature, dim=0)
        probs = log_probs.exp()
        row_grad = -probs * float(grad_logp[position])
        row_grad[token] += float(grad_logp[position])
        if grad_entropy is not None:
            row_entropy = -(probs * torch.where(probs > 0, log_probs, 0.0)).sum()
            term = probs * torch.where(probs > 0, log_probs + row_entropy, 0.0)
            row_grad -= term * float(grad_entropy[position])
        grad[row] += row_grad / temperature  # a row selected twice gets both gradients
    if inplace:
        return logits.copy_(grad)
    return grad.to(logits.dtype)


@hookimpl
def rlk_register(registry) -> None:
    registry.add_backend("testbackend", priority=100, probe=probe, version="0.0.1")
    for op in ("logp", "logp_entropy"):
        registry.add_kernel(op, "testbackend", "rlk_testbackend.good:forward",
                            backward="rlk_testbackend.good:backward", devices=("cpu",),
                            dtypes=(torch.float32,), check=check,
                            properties=("batch_invariant",))
