"""Comparing outputs with the float64 reference, on a subset of rows when the whole is too big.

The references are exact per row, so checking a fixed random subset of rows proves
those rows bit-for-bit as well as a full check would, at a fraction of the memory.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from rlk.bench.workload import Error, Outputs

CHECK_ROWS = 256


def check_rows(count: int, device: torch.device, seed: int) -> Tensor:
    """Up to CHECK_ROWS distinct row indices, sorted, drawn at random (all rows if fewer)."""
    if count <= CHECK_ROWS:
        return torch.arange(count, device=device)
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(count, generator=gen)[:CHECK_ROWS].sort().values.to(device)


def error(name: str, actual: Tensor, expected: Tensor) -> Error:
    """Max |actual - expected|; a NaN on one side only counts as inf, NaN on both as 0."""
    got = actual.detach().to(torch.float64)
    want = expected.detach().to(device=got.device, dtype=torch.float64)
    if got.shape != want.shape:
        raise ValueError(f"{name}: output shape {tuple(got.shape)} does not match the "
                         f"reference shape {tuple(want.shape)}")
    if got.numel() == 0:
        return Error(name, 0.0, 0.0)
    diff = (got - want).abs()
    diff = torch.where(torch.isnan(got) & torch.isnan(want), 0.0, diff)
    diff = torch.where(torch.isnan(diff), float("inf"), diff)
    finite = want[torch.isfinite(want)]
    reach = float(finite.abs().max()) if finite.numel() else 0.0
    return Error(name, float(diff.max()), reach)


def compare_rows(expected: Mapping[str, Tensor], outputs: Outputs, rows: Tensor | None) -> list[
        Error]:
    """Errors of every output the reference covers, restricted to `rows` (None: all of it)."""
    found = []
    for name, want in expected.items():
        if name not in outputs:
            continue
        got = outputs[name]
        if rows is not None:
            got = got[rows.to(got.device)]
        found.append(error(name, got, want))
    return found


def kept_tokens(logits: Tensor, temperature: float, top_k: int, top_p: float,
                min_p: float) -> tuple[Tensor, Tensor]:
    """Float64 log-probs under softmax(logits / T) and the mask of tokens a sampler may return.

    Filters apply in rlk's order (temperature, top-k, top-p, min-p). Ties are kept
    together: a token is allowed when fewer than top_k tokens are strictly more likely,
    and when the mass strictly above it is below top_p (the top token always passes), so
    any valid tie-break is accepted.
    """
    scaled = logits.to(torch.float64) / temperature
    logp = torch.log_softmax(scaled, dim=-1)
    probs = logp.exp()
    keep = torch.isfinite(logp)
    if top_k > 0:
        kth = probs.topk(min(top_k, probs.shape[-1]), dim=-1).values[..., -1:]
        keep &= probs >= kth
    if top_p < 1.0:
        masked = torch.where(keep, probs, 0.0)
        masked = masked / masked.sum(-1, keepdim=True)
        ordered, _ = masked.sort(dim=-1, descending=True)
        above = ordered.cumsum(-1) - ordered
        # mass strictly above each token: the cumulative sum before the first of its ties
        first = torch.searchsorted(-ordered.contiguous(), -masked.contiguous(), side="left")
        mass_above = above.gather(-1, first)
        keep &= mass_above < top_p * (1 + 1e-9)
    if min_p > 0.0:
        top = torch.where(keep, probs, 0.0).amax(-1, keepdim=True)
        keep &= probs >= min_p * top
    return logp, keep


def processed_logp(logp: Tensor, keep: Tensor) -> Tensor:
    """Float64 log-probs renormalised over the kept tokens (-inf elsewhere)."""
    kept = torch.where(keep, logp, float("-inf"))
    return kept - torch.logsumexp(kept, dim=-1, keepdim=True)
