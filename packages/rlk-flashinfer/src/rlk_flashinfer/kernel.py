"""The per-row sampling kernel: one program per row, after FlashInfer's top-k and
rlk_flashinfer.full_vocabulary.chunk_stats have run over the batch.

A row is invalid (token -1, NaN) when its chunk statistics show a NaN, +inf or only -inf.
Else it is served from its shortlist where that fits (rlk_flashinfer.shortlist), else from
its whole vocabulary (rlk_flashinfer.full_vocabulary). Both paths draw with the two
uniforms of the row's seed (rlk_flashinfer.seeds). Which path serves a row is decided in
the kernel, on its logits alone: the host never waits for it.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from rlk_flashinfer import full_vocabulary, shortlist
from rlk_flashinfer.full_vocabulary import CHUNK
from rlk_flashinfer.seeds import uniform


def chunk_statistics(logits: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(maxima, sums) float32 [B, slots]: full_vocabulary.chunk_stats of contiguous logits."""
    batch, vocab = logits.shape
    chunks = triton.cdiv(vocab, CHUNK)
    maxima = torch.empty(batch, triton.next_power_of_2(chunks), dtype=torch.float32,
                         device=logits.device)
    sums = torch.empty_like(maxima)
    full_vocabulary.chunk_stats[(batch, chunks)](logits, vocab, temperature, maxima, sums,
                                                 maxima.shape[1], CHUNK, num_warps=8)
    return maxima, sums


def sample(logits: torch.Tensor, seeds: torch.Tensor, maxima: torch.Tensor, sums: torch.Tensor,
           values: torch.Tensor, indices: torch.Tensor, temperature: float, top_k: int,
           top_p: float, min_p: float, tokens: torch.Tensor, processed: torch.Tensor) -> None:
    """Launch sample_rows over the batch; `values`/`indices` [B, K] are the shortlists
    (K = 0: none), top_k is 0 or below V."""
    batch, vocab = logits.shape
    size = values.shape[1]
    sample_rows[(batch,)](
        logits, vocab, seeds, maxima, sums, values, indices, size, temperature, top_k, top_p,
        math.log(min_p) if min_p > 0.0 else 0.0, tokens, processed, maxima.shape[1], CHUNK,
        triton.cdiv(vocab, CHUNK), triton.next_power_of_2(size) if size else 0, top_k > 0,
        top_p < 1.0, min_p > 0.0, num_warps=8)


@triton.jit
def sample_rows(logits, vocab, seeds, maxima, sums, values, indices, size,
                temperature, top_k, top_p, log_min_p, tokens, processed,
                CHUNKS: tl.constexpr, CHUNK: tl.constexpr, COUNT: tl.constexpr,
                SHORTLIST: tl.constexpr,
                TOP_K: tl.constexpr, TOP_P: tl.constexpr, MIN_P: tl.constexpr):
    """tokens[row] and processed[row] (float32) for each program's row."""
    row = tl.program_id(0)
    seed = tl.load(seeds + row)
    row_logits = logits + row.to(tl.int64) * vocab
    row_maxima, row_sums = maxima + row * CHUNKS, sums + row * CHUNKS
    slots = tl.arange(0, CHUNKS)
    largest = tl.load(row_maxima + slots, mask=slots < COUNT, other=-float("inf"))
    top = tl.max(largest, 0)
    invalid = ((tl.sum((largest != largest).to(tl.int32), 0) > 0) | (top == float("inf"))
               | (top == -float("inf")))
    if invalid:
        tl.store(tokens + row, -1)
        tl.store(processed + row, float("nan"))
    else:
        fits = False
        if SHORTLIST:
            total = tl.load(row_sums + slots, mask=slots < COUNT, other=0.0)
            relative = tl.exp(((largest - top) / temperature).to(tl.float64))
            mass = tl.sum(tl.where(largest == -float("inf"), 0.0,
                                   total.to(tl.float64) * relative), 0)
            fits, token, log_q = shortlist.draw(
                values, indices, row, size, vocab, temperature, top_k, top_p, log_min_p, mass,
                uniform(seed, 1), SHORTLIST, TOP_K, TOP_P, MIN_P)
            if fits:
                tl.store(tokens + row, token)
                tl.store(processed + row, log_q.to(tl.float32))
        if fits == 0:
            threshold = tl.full((), -2139095041, tl.int64)  # key(-inf): no bound
            if TOP_K or TOP_P or MIN_P:
                threshold = full_vocabulary.filter_chunks(
                    row_logits, vocab, top, temperature, top_k, top_p, log_min_p, row_maxima,
                    row_sums, CHUNK, COUNT, TOP_K, TOP_P, MIN_P)
            drawn, log_drawn = full_vocabulary.draw(
                row_logits, vocab, top, temperature, threshold, log_min_p, row_maxima,
                row_sums, uniform(seed, 1), uniform(seed, 2), CHUNKS, CHUNK, COUNT, MIN_P)
            tl.store(tokens + row, drawn)
            tl.store(processed + row, log_drawn.to(tl.float32))
