"""Statistics shared by the CPU and GPU tests: float64 references and a chi-square test."""

from __future__ import annotations

import math

import torch


def truncated_reference(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
                        min_p: float) -> torch.Tensor:
    """float64 distribution after temperature, top-k, top-p, min-p (in that order), renormalised."""
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    vocab = probs.shape[-1]
    if 0 < top_k < vocab:
        kth = probs.topk(top_k, dim=-1).values[..., -1:]
        probs = probs * (probs >= kth)
        probs = probs / probs.sum(-1, keepdim=True)
    if top_p < 1.0:
        ordered, order = probs.sort(dim=-1, descending=True)
        keep = (ordered.cumsum(-1) - ordered) < top_p
        probs = probs * torch.zeros_like(keep).scatter(-1, order, keep)
        probs = probs / probs.sum(-1, keepdim=True)
    if min_p > 0.0:
        probs = probs * (probs >= probs.amax(-1, keepdim=True) * min_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def chi_square(tokens: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson statistic of token counts against `probs` [V] (cells below 5 expected pooled)."""
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    expected = probs.double() * tokens.numel()
    big = expected >= 5
    observed = torch.cat([counts[big], counts[~big].sum().reshape(1)])
    wanted = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    if float(wanted[-1]) < 5:  # fold a tiny pooled cell into the smallest kept cell
        observed, wanted = observed[:-1].clone(), wanted[:-1].clone()
        observed[wanted.argmin()] += counts[~big].sum()
        wanted[wanted.argmin()] += expected[~big].sum()
    statistic = float(((observed - wanted) ** 2 / wanted).sum())
    return statistic, observed.numel() - 1


def chi_square_critical(dof: int, z: float = 3.719) -> float:
    """Upper critical value (z = 3.719: alpha 1e-4) by the Wilson-Hilferty approximation."""
    term = 2.0 / (9.0 * dof)
    return dof * (1.0 - term + z * math.sqrt(term)) ** 3
