"""The `sample` kernel: FlashInfer selects and filters, rlk draws and computes log-probs.

Every row is first served from its shortlist (rlk_flashinfer.shortlist): FlashInfer's radix
top-k gives its K largest logits and, when the filters keep nothing beyond them, the row is
done in float64 on those K. The other rows, and plain sampling, take the full-vocabulary
path (rlk_flashinfer.full_vocabulary: FlashInfer's softmax and renormalisations). Which
path a row takes depends on its logits alone.

The draw is rlk's own on both paths, from uniforms of the row's seed
(rlk_flashinfer.seeds): FlashInfer's samplers key a row's random numbers by its position in
the launch, so with them a row's token would depend on the batch. Every FlashInfer kernel
runs once per block of rows, whatever the seeds. `logp` comes from `rlk.logp` itself, so it
matches it bit for bit.
"""

from __future__ import annotations

import math

import torch

from rlk.backend import drawn_logp
from rlk_flashinfer import full_vocabulary, library, shortlist
from rlk_flashinfer.seeds import uniforms

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
    batch, vocab = logits.shape
    device = logits.device
    tokens = torch.full((batch,), -1, dtype=torch.int64, device=device)
    processed = torch.full((batch,), math.nan, dtype=torch.float64, device=device)
    full = torch.zeros(batch, dtype=torch.bool, device=device)
    log_mass = torch.full((batch,), math.nan, dtype=torch.float64, device=device)
    if batch > 0:
        # amax is NaN for a row holding NaN, +inf for one holding +inf, -inf for all -inf.
        valid = torch.isfinite(logits.amax(dim=-1))
        if temperature == 0.0:
            tokens = torch.where(valid, logits.argmax(dim=-1), tokens)
        else:
            k = top_k if 0 < top_k < vocab else 0
            u = uniforms(seeds.to(device), 2)
            full = valid & ~_sample_shortlists(logits, valid, temperature, k, top_p, min_p, u,
                                               tokens, processed)
            rows = full.nonzero()[:, 0]
            if rows.numel():
                full_vocabulary.sample_rows(logits, rows, temperature, k, top_p, min_p, u,
                                            tokens, log_mass)
    logp = drawn_logp(logits, tokens, temperature)
    if temperature == 0.0:
        return tokens, logp, torch.where(tokens >= 0, 0.0, math.nan).to(torch.float32)
    processed = torch.where(full, logp.double() - log_mass, processed)
    return tokens, logp, processed.to(torch.float32)


def _sample_shortlists(logits: torch.Tensor, valid: torch.Tensor, temperature: float, k: int,
                       top_p: float, min_p: float, u: torch.Tensor, tokens: torch.Tensor,
                       processed: torch.Tensor) -> torch.Tensor:
    """Serve every valid row whose kept set fits its shortlist, writing its token and
    processed_logp; returns which rows were served."""
    batch, vocab = logits.shape
    size = shortlist.size(vocab, k, top_p, min_p)
    served = torch.zeros(batch, dtype=torch.bool, device=logits.device)
    if size is None:
        return served
    top_k = library.load_topk().top_k
    for part in full_vocabulary.blocks(batch, vocab):
        block = logits[part].contiguous()
        values, indices = top_k(block, size, sorted=True, deterministic=True)
        log_mass = None
        if k == 0 and top_p < 1.0:  # the nucleus is relative to the whole softmax
            log_mass = -drawn_logp(block, indices[:, 0], temperature).double()[:, None]
        fits, picked, log_q = shortlist.sample(values, indices, vocab, temperature, k, top_p,
                                               min_p, log_mass, u[part, 0])
        fits &= valid[part]
        served[part] = fits
        tokens[part] = torch.where(fits, picked, tokens[part])
        processed[part] = torch.where(fits, log_q, processed[part])
    return served


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
