"""The `sample` kernel: FlashInfer draws the token, rlk computes its log-probabilities.

Pipeline per block of rows (temperature > 0), all in float32:
  softmax = flashinfer softmax(logits, temperature=T)  # the only place T is applied
  probs = top_k_renorm_probs(softmax, k)               # when 0 < k < V
  probs = top_p_renorm_probs(probs, p)                 # when p < 1
  token = [min_p_]sampling_from_probs(probs, ...)      # min-p relative to the top token
`logp` comes from `rlk.logp` itself so that it matches it bit for bit, and
`processed_logp = logp - log(mass of the kept set under softmax)`. At any token the
filters kept, softmax / probs is the mass of the top-k/top-p set (FlashInfer renormalised
probs by it), so the mass costs a gather; min-p multiplies in the share of `probs` at or
above its threshold, one masked sum. No filter: processed_logp equals logp exactly.
Rows are copied into contiguous blocks of at most 2**26 elements: FlashInfer needs
contiguous rows and indexes them with 32-bit row * vocab products.
"""

from __future__ import annotations

import inspect
import itertools
import math
from collections.abc import Sequence
from types import ModuleType

import torch

from rlk.backend import drawn_logp
from rlk_flashinfer import library
from rlk_flashinfer.seeds import plan_launches

BLOCK_ELEMENTS = 1 << 26
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
    host_seeds = seeds.to("cpu")[rows.cpu()].tolist()
    per_block = max(1, BLOCK_ELEMENTS // vocab)
    for start in range(0, rows.numel(), per_block):
        part = rows[start:start + per_block]
        if every_row:
            block = logits[start:start + part.numel()].contiguous()
        else:
            block = logits.index_select(0, part)
        picked, block_log_mass = _sample_block(
            fi, block, host_seeds[start:start + per_block], temperature, top_k, top_p, min_p
        )
        tokens[part] = picked
        log_mass[part] = block_log_mass


def _sample_block(fi: ModuleType, block: torch.Tensor, seeds: Sequence[int], temperature: float,
                  top_k: int, top_p: float, min_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Filter and draw for one contiguous block of valid rows: (tokens, log of the kept mass)."""
    vocab = block.shape[1]
    softmax = fi.softmax(block, temperature=float(temperature))
    probs = softmax
    if 0 < top_k < vocab:
        probs = fi.top_k_renorm_probs(probs, int(top_k))
    if top_p < 1.0:
        probs = _top_p_renorm(fi, probs, float(top_p))
    picked = _draw(fi, probs, seeds, min_p)
    return picked, _kept_log_mass(softmax, probs, picked, min_p)


def _kept_log_mass(softmax: torch.Tensor, probs: torch.Tensor, picked: torch.Tensor,
                   min_p: float) -> torch.Tensor:
    """log of the kept set's mass under `softmax`, float64 per row (see the module notes)."""
    at = picked[:, None]
    ratio = softmax.gather(1, at).double() / probs.gather(1, at).double()
    log_mass = ratio[:, 0].log()
    if min_p > 0.0:
        # the threshold FlashInfer's min-p sampler applies to `probs`, in float32 as it does
        floor = probs.amax(dim=-1, keepdim=True) * float(min_p)
        share = torch.where(probs >= floor, probs, 0.0).sum(dim=-1, dtype=torch.float64)
        log_mass += share.log()
    return log_mass


def _top_p_renorm(fi: ModuleType, probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Ask for FlashInfer's deterministic (integer-accumulating) top-p where it has one."""
    renorm = fi.top_p_renorm_probs
    if "is_deterministic" in inspect.signature(renorm).parameters:
        renormed: torch.Tensor = renorm(probs, top_p, is_deterministic=True)
    else:
        renormed = renorm(probs, top_p)
    return renormed


def _draw(fi: ModuleType, probs: torch.Tensor, seeds: Sequence[int], min_p: float) -> torch.Tensor:
    """Draw one token per row of `probs`, each keyed by its own seed (see rlk_flashinfer.seeds)."""
    launches = plan_launches(seeds)
    sizes = [launch.size for launch in launches]
    starts = [0, *itertools.accumulate(sizes)][:-1]
    layout = [i for launch in launches for i in launch.indices()]
    rows = [row for launch in launches for row in launch.rows]
    positions = [
        start + slot
        for start, launch in zip(starts, launches, strict=True)
        for slot in launch.slots
    ]
    # one host-to-device copy for the launch layouts and the scatter back to rows
    plan = torch.tensor([*layout, *positions, *rows], dtype=torch.int64).to(probs.device)
    device_layout, where, row_index = plan.split([len(layout), len(positions), len(rows)])
    drawn = []
    for launch, indices in zip(launches, torch.split(device_layout, sizes), strict=True):
        if min_p > 0.0:
            out = fi.min_p_sampling_from_probs(probs, float(min_p), indices=indices,
                                               deterministic=True, seed=launch.key, offset=0)
        else:
            out = fi.sampling_from_probs(probs, indices=indices, deterministic=True,
                                         seed=launch.key, offset=0)
        drawn.append(out.to(torch.int64))
    picked = torch.empty(probs.shape[0], dtype=torch.int64, device=probs.device)
    picked[row_index] = torch.cat(drawn)[where]
    return picked
