"""The full-vocabulary path: FlashInfer's softmax and renormalisations, then rlk's draw.

For rows whose kept set may reach past their shortlist (rlk_flashinfer.shortlist), and for
plain sampling. Per block of rows, all in float32:
  softmax = flashinfer softmax(logits, temperature=T)  # the only place T is applied
  probs = top_k_renorm_probs(softmax, k)               # when 0 < k < V
  probs = top_p_renorm_probs(probs, p)                 # when p < 1
  weights = probs where probs >= min_p * max(probs)    # when min_p > 0 (FlashInfer's rule)
  token = rlk_flashinfer.draw(weights, the row's uniforms)
The log of the kept set's mass under softmax comes almost free: at any token the filters
kept, softmax / probs is the mass of the top-k/top-p set (FlashInfer renormalised probs by
it), and min-p multiplies in the weights' total, which the draw sums anyway. No filter:
the ratio is 1 and processed_logp equals logp exactly.
Rows are copied into contiguous blocks of at most BLOCK_ELEMENTS elements: FlashInfer needs
contiguous rows and indexes them with 32-bit row * vocab products.
"""

from __future__ import annotations

import inspect
from types import ModuleType

import torch
from torch import Tensor

from rlk.backend import overflow_safe
from rlk_flashinfer import library
from rlk_flashinfer.draw import draw

BLOCK_ELEMENTS = 1 << 28


def blocks(batch: int, vocab: int) -> list[slice]:
    """Consecutive row ranges of at most BLOCK_ELEMENTS elements."""
    per_block = max(1, BLOCK_ELEMENTS // vocab)
    return [slice(start, min(start + per_block, batch)) for start in range(0, batch, per_block)]


def sample_rows(logits: Tensor, rows: Tensor, temperature: float, top_k: int, top_p: float,
                min_p: float, uniforms: Tensor, tokens: Tensor, log_mass: Tensor) -> None:
    """Sample logits[rows] (valid rows, in increasing order), writing into `tokens` and
    `log_mass` at `rows`."""
    fi = library.load_sampling()
    every_row = rows.numel() == logits.shape[0]  # then rows is arange: slice, do not gather
    for part in blocks(rows.numel(), logits.shape[1]):
        chosen = rows[part]
        block = logits[part].contiguous() if every_row else logits.index_select(0, chosen)
        picked, mass = _sample_block(fi, block, uniforms[chosen], temperature, top_k, top_p,
                                     min_p)
        tokens[chosen] = picked
        log_mass[chosen] = mass


def _sample_block(fi: ModuleType, block: Tensor, uniforms: Tensor, temperature: float, top_k: int,
                  top_p: float, min_p: float) -> tuple[Tensor, Tensor]:
    """Filter and draw for one contiguous block of rows: (tokens, log of the kept mass)."""
    # FlashInfer's softmax multiplies by 1/T in float32: a tiny T would overflow into NaN
    block, temperature = overflow_safe(block, temperature)
    softmax: Tensor = fi.softmax(block, temperature=float(temperature))
    probs = softmax
    if top_k > 0:
        probs = fi.top_k_renorm_probs(probs, int(top_k))
    if top_p < 1.0:
        probs = top_p_renorm(fi, probs, float(top_p))
    weights = probs
    if min_p > 0.0:
        floor = probs.amax(dim=-1, keepdim=True) * float(min_p)
        weights = torch.where(probs >= floor, probs, 0.0)
    picked, kept = draw(weights, uniforms)
    at = picked[:, None]
    log_mass = (softmax.gather(1, at).double() / probs.gather(1, at).double())[:, 0].log()
    if min_p > 0.0:
        log_mass += kept.log()
    return picked, log_mass


def top_p_renorm(fi: ModuleType, probs: Tensor, top_p: float) -> Tensor:
    """Ask for FlashInfer's deterministic (integer-accumulating) top-p where it has one."""
    renorm = fi.top_p_renorm_probs
    if "is_deterministic" in inspect.signature(renorm).parameters:
        renormed: Tensor = renorm(probs, top_p, is_deterministic=True)
    else:
        renormed = renorm(probs, top_p)
    return renormed
