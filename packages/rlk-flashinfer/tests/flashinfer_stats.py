"""The chi-square test shared by the CPU and GPU tests (the float64 reference is
rlk.ops.sample.reference)."""

from __future__ import annotations

import math

import torch


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
