"""The `sample` kernel: FlashInfer's radix top-k selects, rlk's Triton kernels draw.

A call is a handful of launches and never waits for the device:
  full_vocabulary.chunk_stats   one read of the logits: per chunk its maximum and sum-exp
  flashinfer.top_k              each row's shortlist, when a filter can bound the kept set
  kernel.sample_rows            one program per row: validity, greedy, shortlist or whole
                                vocabulary; writes tokens (-1: none) and processed_logp
  rlk.backend.drawn_logp        `logp` of the drawn tokens, so that it matches bit for bit
and, with no filter, a copy of logp as processed_logp. The host work per call is counted:
three allocations (two with no filter), the launches above, no other torch op.

The draw uses uniforms of the row's own seed (rlk_flashinfer.seeds): FlashInfer's samplers
key a row's random numbers by its position in the launch (0.7) or read one seed for all
rows (0.6), so with them a row's token would depend on the batch.
"""

from __future__ import annotations

import math

import torch

from rlk.backend import drawn_logp
from rlk_flashinfer import library

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
BLOCK_ELEMENTS = 1 << 28  # FlashInfer's top-k indexes a launch with 32-bit row * vocab


def sample(
    logits: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    seeds: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One token per row; returns (tokens int64 [B], logp f32 [B], processed_logp f32 [B]).

    Temperature 0 is greedy: the first largest logit, logp at T = 1, processed_logp 0."""
    check_arguments(logits, temperature, top_k, top_p, min_p, seeds)
    batch, vocab = logits.shape
    device = logits.device
    k = top_k if 0 < top_k < vocab else 0
    # greedy and every filter write processed_logp; with no filter it is logp itself
    plain = temperature > 0.0 and (k, top_p, min_p) == (0, 1.0, 0.0)
    tokens = torch.empty(batch, dtype=torch.int64, device=device)
    processed = None if plain else torch.empty(batch, dtype=torch.float32, device=device)
    if batch > 0:
        from rlk_flashinfer import kernel, shortlist  # Triton: imported on first use

        if not logits.is_contiguous():
            logits = logits.contiguous()
        stats = kernel.statistics(logits, temperature or 1.0)
        size = None if temperature == 0.0 else shortlist.size(vocab, k, top_p, min_p)
        shortlists = None if size is None else _shortlists(logits, size)
        kernel.sample(logits, seeds, stats, shortlists, temperature, k, top_p, min_p, tokens,
                      processed)
    logp = drawn_logp(logits, tokens, temperature)  # flashinfer has no logp kernel
    return tokens, logp, logp.clone() if processed is None else processed


def _shortlists(logits: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer's radix top-k of every row, unsorted (the kernel orders ties itself), in
    launches of at most BLOCK_ELEMENTS logits."""
    batch, vocab = logits.shape
    per_block = max(1, BLOCK_ELEMENTS // vocab)
    top_k = library.load_topk().top_k
    if batch <= per_block:  # one launch: its outputs as they are
        shortlists: tuple[torch.Tensor, torch.Tensor] = top_k(logits, size, sorted=False,
                                                               deterministic=True)
        return shortlists
    values = torch.empty(batch, size, dtype=logits.dtype, device=logits.device)
    indices = torch.empty(batch, size, dtype=torch.int64, device=logits.device)
    for start in range(0, batch, per_block):
        part = slice(start, min(start + per_block, batch))
        values[part], indices[part] = top_k(logits[part], size, sorted=False,
                                            deterministic=True)
    return values, indices


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
    if seeds.device != logits.device:
        raise ValueError(f"seeds must be on the logits' device {logits.device}, got {seeds.device}")


def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    return float(value)


def _integer(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return value
