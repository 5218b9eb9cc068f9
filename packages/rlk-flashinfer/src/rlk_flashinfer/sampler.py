"""The `sample` kernel: FlashInfer filters, rlk draws and computes the log-probabilities.

Pipeline per block of rows (temperature > 0), all in float32:
  softmax = flashinfer softmax(logits, temperature=T)  # the only place T is applied
  probs = top_k_renorm_probs(softmax, k)               # when 0 < k < V
  probs = top_p_renorm_probs(probs, p)                 # when p < 1
  weights = probs where probs >= min_p * max(probs)    # when min_p > 0 (FlashInfer's rule)
  token = rlk_flashinfer.draw(weights, uniforms of the row's seed)
The draw is rlk's own: FlashInfer's samplers key a row's random numbers by its position
in the launch (see rlk_flashinfer.seeds), so with them a row's token would depend on the
batch. Every FlashInfer kernel runs once per block of rows, whatever the seeds.
`logp` comes from `rlk.logp` itself so that it matches it bit for bit, and
`processed_logp = logp - log(mass of the kept set under softmax)`. At any token the
filters kept, softmax / probs is the mass of the top-k/top-p set (FlashInfer renormalised
probs by it), so the mass costs a gather; min-p multiplies in the weights' total, which
the draw sums anyway. No filter: processed_logp equals logp exactly.
Rows are copied into contiguous blocks of at most 2**28 elements: FlashInfer needs
contiguous rows and indexes them with 32-bit row * vocab products.
"""

from __future__ import annotations

import inspect
import math
from types import ModuleType

import torch

from rlk.ops.sample import drawn_logp
from rlk_flashinfer import library
from rlk_flashinfer.draw import draw
from rlk_flashinfer.seeds import uniforms

BLOCK_ELEMENTS = 1 << 28
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def sample(
    logits: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    seeds: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One token per row; returns (tokens int64 [B], logp f32 [B], processed_logp f32 [B])."""
    check_arguments(logits, temperature, top_k, top_p, min_p, seeds)
    batch, _vocab = logits.shape
    tokens = torch.full((batch,), -1, dtype=torch.int64, device=logits.device)
    log_mass = torch.full((batch,), math.nan, dtype=torch.float64, device=logits.device)
    if batch > 0:
        # amax is NaN for a row holding NaN, +inf for one holding +inf, -inf for all -inf.
        valid = torch.isfinite(logits.amax(dim=-1))
        if temperature == 0.0:
            tokens = torch.where(valid, logits.argmax(dim=-1), tokens)
        else:
            _sample_rows(library.load_sampling(), logits, valid, temperature, top_k, top_p,
                         min_p, seeds, tokens, log_mass)
    logp = drawn_logp(logits, tokens, temperature)
    if temperature == 0.0:
        processed = torch.where(tokens >= 0, 0.0, math.nan).to(torch.float32)
    else:
        processed = (logp.double() - log_mass).to(torch.float32)
    return tokens, logp, processed


def check_arguments(logits: object, temperature: object, top_k: object, top_p: object,
                    min_p: object, seeds: object) -> None:
    """Raise TypeError/ValueError naming the expected and received value."""
    if not isinstance(logits, torch.Tensor) or logits.dtype not in _FLOATS:
        got = logits.dtype if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise TypeError(f"logits must be a float32/bfloat16/float16 tensor, got {got}")
    if logits.dim() != 2 or logits.shape[1] == 0:
        raise ValueError(f"logits must be 2-D [B, V] with V >= 1, got shape {tuple(logits.shape)}")
    if not (0.0 <= _real("temperature", temperature) < math.inf):
        raise ValueError(f"temperature must be finite and >= 0 (0 = greedy), got {temperature}")
    if _integer("top_k", top_k) < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {top_k}")
    if not (0.0 < _real("top_p", top_p) <= 1.0):
        raise ValueError(f"top_p must be in (0, 1] (1 = off), got {top_p}")
    if not (0.0 <= _real("min_p", min_p) < 1.0):
        raise ValueError(f"min_p must be in [0, 1) (0 = off), got {min_p}")
    if not isinstance(seeds, torch.Tensor) or seeds.dtype != torch.int64:
        got = seeds.dtype if isinstance(seeds, torch.Tensor) else type(seeds).__name__
        raise TypeError(f"seeds must be an int64 tensor, got {got}")
    if tuple(seeds.shape) != (logits.shape[0],):
        raise ValueError(
            f"seeds must have shape ({logits.shape[0]},), one per row, got {tuple(seeds.shape)}"
        )


def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    return float(value)


def _integer(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return value


def _sample_rows(fi: ModuleType, logits: torch.Tensor, valid: torch.Tensor, temperature: float,
                 top_k: int, top_p: float, min_p: float, seeds: torch.Tensor,
                 tokens: torch.Tensor, log_mass: torch.Tensor) -> None:
    """Sample every valid row in contiguous blocks, writing into `tokens` and `log_mass`."""
    batch, vocab = logits.shape
    every_row = bool(valid.all())
    rows = torch.arange(batch, device=logits.device) if every_row else valid.nonzero()[:, 0]
    per_block = max(1, BLOCK_ELEMENTS // vocab)
    seeds = seeds.to(logits.device)
    for start in range(0, rows.numel(), per_block):
        part = rows[start:start + per_block]
        if every_row:
            block = logits[start:start + part.numel()].contiguous()
        else:
            block = logits.index_select(0, part)
        picked, block_log_mass = _sample_block(
            fi, block, seeds.index_select(0, part), temperature, top_k, top_p, min_p
        )
        tokens[part] = picked
        log_mass[part] = block_log_mass


def _sample_block(fi: ModuleType, block: torch.Tensor, seeds: torch.Tensor, temperature: float,
                  top_k: int, top_p: float, min_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Filter and draw for one contiguous block of valid rows: (tokens, log of the kept mass)."""
    vocab = block.shape[1]
    softmax = fi.softmax(block, temperature=float(temperature))
    probs = softmax
    if 0 < top_k < vocab:
        probs = fi.top_k_renorm_probs(probs, int(top_k))
    if top_p < 1.0:
        probs = _top_p_renorm(fi, probs, float(top_p))
    weights = probs
    if min_p > 0.0:
        # FlashInfer's min-p rule, in float32 as its sampler applies it to `probs`
        floor = probs.amax(dim=-1, keepdim=True) * float(min_p)
        weights = torch.where(probs >= floor, probs, 0.0)
    picked, kept = draw(weights, uniforms(seeds, 2))
    at = picked[:, None]
    # the top-k/top-p mass under softmax (see the module notes), times min-p's share of it
    ratio = softmax.gather(1, at).double() / probs.gather(1, at).double()
    log_mass = ratio[:, 0].log()
    if min_p > 0.0:
        log_mass += kept.log()
    return picked, log_mass


def _top_p_renorm(fi: ModuleType, probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Ask for FlashInfer's deterministic (integer-accumulating) top-p where it has one."""
    renorm = fi.top_p_renorm_probs
    if "is_deterministic" in inspect.signature(renorm).parameters:
        renormed: torch.Tensor = renorm(probs, top_p, is_deterministic=True)
    else:
        renormed = renorm(probs, top_p)
    return renormed
