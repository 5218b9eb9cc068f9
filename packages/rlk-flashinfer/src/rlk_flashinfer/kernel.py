"""The two Triton launches of a call: rlk_flashinfer.full_vocabulary.chunk_stats over the
batch, then (after FlashInfer's top-k, where a filter can bound the kept set) sample_rows,
one program per row.

A row is invalid (token -1, processed_logp NaN) when its chunk statistics show a NaN, +inf
or only -inf. Else at T = 0 it gets the first largest logit; at T > 0 it is served from
its shortlist where that fits (rlk_flashinfer.shortlist), else from its whole vocabulary
(rlk_flashinfer.full_vocabulary). Both draw with the two uniforms of the row's seed
(rlk_flashinfer.seeds). Which path serves a row is decided in the kernel, on its logits
alone: the host never waits for it.

The statistics live in one float32 buffer [B, 2, CHUNKS] (a row's chunk maxima, then its
chunk sums). Every setting that changes a kernel's code is a constexpr (the vocabulary,
the filters switched on, greedy or not); values that change between calls with the same
code (top_k, the shortlist length) are not specialised on, so they never recompile.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from rlk_flashinfer import full_vocabulary, shortlist
from rlk_flashinfer.full_vocabulary import CHUNK
from rlk_flashinfer.seeds import uniform


def statistics(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """chunk_stats of contiguous logits [B, V] into a new buffer [B, 2, CHUNKS]."""
    batch, vocab = logits.shape
    chunks = triton.cdiv(vocab, CHUNK)
    slots = triton.next_power_of_2(chunks)
    stats = torch.empty(batch, 2, slots, dtype=torch.float32, device=logits.device)
    full_vocabulary.chunk_stats[(batch, chunks)](logits, temperature, stats, vocab, slots,
                                                 CHUNK, num_warps=8)
    return stats


def sample(logits: torch.Tensor, seeds: torch.Tensor, stats: torch.Tensor,
           shortlists: tuple[torch.Tensor, torch.Tensor] | None, temperature: float,
           top_k: int, top_p: float, min_p: float, tokens: torch.Tensor,
           processed: torch.Tensor | None) -> None:
    """Launch sample_rows over the batch: `shortlists` (values, indices) [B, K] or None,
    top_k 0 or below V, temperature 0 for greedy; `processed` None: not written (no filter,
    where processed_logp is logp)."""
    batch, vocab = logits.shape
    values, indices = shortlists if shortlists is not None else (logits, tokens)
    size = values.shape[1] if shortlists is not None else 0
    sample_rows[(batch,)](
        logits, seeds, stats, values, indices, size, temperature or 1.0, top_k, top_p,
        math.log(min_p) if min_p > 0.0 else 0.0, tokens,
        stats if processed is None else processed, vocab, stats.shape[2], CHUNK,
        triton.cdiv(vocab, CHUNK), triton.next_power_of_2(size) if size else 0,
        temperature == 0.0, top_k > 0, top_p < 1.0, min_p > 0.0, processed is not None,
        num_warps=8)


@triton.jit(do_not_specialize=["size", "top_k"])
def sample_rows(logits, seeds, stats, values, indices, size, temperature, top_k, top_p,
                log_min_p, tokens, processed, VOCAB: tl.constexpr, CHUNKS: tl.constexpr,
                CHUNK: tl.constexpr, COUNT: tl.constexpr, SHORTLIST: tl.constexpr,
                GREEDY: tl.constexpr,
                TOP_K: tl.constexpr, TOP_P: tl.constexpr, MIN_P: tl.constexpr,
                PROCESSED: tl.constexpr):
    """tokens[row] and (where PROCESSED) processed[row] (float32) for each program's row."""
    row = tl.program_id(0)
    row_logits = logits + row.to(tl.int64) * VOCAB
    row_maxima = stats + row * (2 * CHUNKS)
    row_sums = row_maxima + CHUNKS
    slots = tl.arange(0, CHUNKS)
    largest = tl.load(row_maxima + slots, mask=slots < COUNT, other=-float("inf"))
    top = tl.max(largest, 0)
    invalid = ((tl.sum((largest != largest).to(tl.int32), 0) > 0) | (top == float("inf"))
               | (top == -float("inf")))
    if invalid:
        tl.store(tokens + row, -1)
        if PROCESSED:
            tl.store(processed + row, float("nan"))
    elif GREEDY:
        tl.store(tokens + row,
                 full_vocabulary.first_largest(row_logits, VOCAB, top, largest, CHUNKS, CHUNK))
        tl.store(processed + row, 0.0)
    else:
        seed = tl.load(seeds + row)
        fits = False
        if SHORTLIST:
            total = tl.load(row_sums + slots, mask=slots < COUNT, other=0.0)
            relative = tl.exp(((largest - top) / temperature).to(tl.float64))
            mass = tl.sum(tl.where(largest == -float("inf"), 0.0,
                                   total.to(tl.float64) * relative), 0)
            fits, token, log_q = shortlist.draw(
                values, indices, row, size, VOCAB, temperature, top_k, top_p, log_min_p, mass,
                uniform(seed, 1), SHORTLIST, TOP_K, TOP_P, MIN_P)
            if fits:
                tl.store(tokens + row, token)
                tl.store(processed + row, log_q.to(tl.float32))
        if fits == 0:
            threshold = tl.full((), -2139095041, tl.int64)  # key(-inf): no bound
            if TOP_K or TOP_P or MIN_P:
                threshold = full_vocabulary.filter_chunks(
                    row_logits, VOCAB, top, temperature, top_k, top_p, log_min_p, row_maxima,
                    row_sums, CHUNK, COUNT, TOP_K, TOP_P, MIN_P)
            drawn, log_drawn = full_vocabulary.draw(
                row_logits, VOCAB, top, temperature, threshold, log_min_p, row_maxima,
                row_sums, uniform(seed, 1), uniform(seed, 2), CHUNKS, CHUNK, COUNT, MIN_P)
            tl.store(tokens + row, drawn)
            if PROCESSED:
                tl.store(processed + row, log_drawn.to(tl.float32))
