"""The `sample` kernel: FlashInfer draws the token, rlk computes its log-probabilities.

Pipeline per block of rows (temperature > 0), all in float32:
  probs = flashinfer softmax(logits, temperature=T)   # the only place T is applied
  probs = top_k_renorm_probs(probs, k)                # when 0 < k < V
  probs = top_p_renorm_probs(probs, p)                # when p < 1
  token = [min_p_]sampling_from_probs(probs, ...)     # min-p relative to the top token
The kept set (probs > 0 after the filters, and >= min_p * max when min-p is on) gives
`processed_logp`; `logp` comes from `rlk.logp` itself so that it matches it bit for bit.
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

from rlk.ops.sample import drawn_logp
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
    processed = torch.full((batch,), math.nan, dtype=torch.float32, device=logits.device)
    if batch > 0:
        # amax is NaN for a row holding NaN, +inf for one holding +inf, -inf for all -inf.
        valid = torch.isfinite(logits.amax(dim=-1))
        if temperature == 0.0:
            tokens = torch.where(valid, logits.argmax(dim=-1), tokens)
            processed = torch.where(valid, torch.zeros_like(processed), processed)
        else:
            _sample_rows(library.load_sampling(), logits, valid, temperature, top_k, top_p,
                         min_p, seeds, tokens, processed)
    return tokens, drawn_logp(logits, tokens, temperature), processed


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
                 tokens: torch.Tensor, processed: torch.Tensor) -> None:
    """Sample every valid row in contiguous blocks, writing into `tokens` and `processed`."""
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
        picked, block_processed = _sample_block(
            fi, block, host_seeds[start:start + per_block], temperature, top_k, top_p, min_p
        )
        tokens[part] = picked
        processed[part] = block_processed


def _sample_block(fi: ModuleType, block: torch.Tensor, seeds: Sequence[int], temperature: float,
                  top_k: int, top_p: float, min_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Filter and draw for one contiguous block of valid rows."""
    vocab = block.shape[1]
    probs = fi.softmax(block, temperature=float(temperature))
    if 0 < top_k < vocab:
        probs = fi.top_k_renorm_probs(probs, int(top_k))
    if top_p < 1.0:
        probs = _top_p_renorm(fi, probs, float(top_p))
    kept = probs > 0
    if min_p > 0.0:
        kept &= probs >= probs.amax(dim=-1, keepdim=True) * float(min_p)
    picked = _draw(fi, probs, seeds, min_p)
    return picked, _processed_logp(block, picked, kept, temperature)


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
    drawn = []
    device_layout = torch.tensor(layout, dtype=torch.int64).to(probs.device)
    for launch, indices in zip(launches, torch.split(device_layout, sizes), strict=True):
        if min_p > 0.0:
            out = fi.min_p_sampling_from_probs(probs, float(min_p), indices=indices,
                                               deterministic=True, seed=launch.key, offset=0)
        else:
            out = fi.sampling_from_probs(probs, indices=indices, deterministic=True,
                                         seed=launch.key, offset=0)
        drawn.append(out.to(torch.int64))
    picked = torch.empty(probs.shape[0], dtype=torch.int64, device=probs.device)
    where = torch.tensor(positions, dtype=torch.int64).to(probs.device)
    picked[torch.tensor(rows, dtype=torch.int64).to(probs.device)] = torch.cat(drawn)[where]
    return picked


def _processed_logp(block: torch.Tensor, picked: torch.Tensor, kept: torch.Tensor,
                    temperature: float) -> torch.Tensor:
    """log q(token), q = softmax(logits / T) restricted to the kept set and renormalised."""
    scaled = block.float() / temperature
    kept_lse = torch.logsumexp(scaled.masked_fill(~kept, -math.inf), dim=-1)
    return scaled.gather(1, picked[:, None])[:, 0] - kept_lse
