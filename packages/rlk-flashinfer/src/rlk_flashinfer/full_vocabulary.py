"""The full-vocabulary path, for plain sampling and for rows whose kept set may reach past
their shortlist (rlk_flashinfer.shortlist).

`chunk_stats` (a kernel over rows x chunks of CHUNK logits, so that small batches still
fill the GPU) reads every logit once: per chunk its largest logit m and the sum of
exp((x - m) / T), NaN as m when the chunk holds a NaN or +inf. With no filter that is all
the draw needs: the chunks' masses relative to the row's largest logit pick a chunk, then
the chunk's own weights pick a token (rlk_flashinfer.draw.pick, exact, twice).

With filters, one program per row finds the kept set's bounds on the logits themselves, by
bisection on order keys (rlk_flashinfer.draw.key), one pass over the row per step: the
k-th largest logit (count of logits at or above a key), then the top-p cut (their mass),
as rlk.ops.sample.reference does, ties kept together; min-p is a test per logit. Then one pass
writes the kept set's chunk statistics over the row's own, and the same two-level draw follows.
Such rows cost tens of passes over their logits, from L2, by one program each: the price
of needing no host sync to find them (see docs/decisions.md).
"""

from __future__ import annotations

import triton
import triton.language as tl

from rlk_flashinfer.draw import key, pick

CHUNK = 4096
_KEY_LOW = tl.constexpr(-2139095041)  # key(-inf)


@triton.jit
def chunk_stats(logits, temperature, stats, VOCAB: tl.constexpr, CHUNKS: tl.constexpr,
                CHUNK: tl.constexpr):
    """Per (row, chunk): the largest logit (NaN if the chunk holds NaN or +inf) and the sum
    of exp((x - largest) / T) over the chunk, into the row's `stats` (rlk_flashinfer.kernel)."""
    row, chunk = tl.program_id(0), tl.program_id(1)
    columns = chunk * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(logits + row.to(tl.int64) * VOCAB + columns, mask=columns < VOCAB,
                other=-float("inf")).to(tl.float32)
    bad = tl.sum(((x != x) | (x == float("inf"))).to(tl.int32), 0) > 0
    top = tl.max(x, 0)
    total = tl.sum(tl.exp((x - top) / temperature), 0)
    total = tl.where(top == -float("inf"), 0.0, total)
    at = stats + row * (2 * CHUNKS) + chunk
    tl.store(at, tl.where(bad, float("nan"), top))
    tl.store(at + CHUNKS, total)


@triton.jit
def _count_from(row_logits, vocab, threshold, CHUNK: tl.constexpr,
                COUNT: tl.constexpr):
    """How many logits of the row have a key >= threshold."""
    count = tl.zeros((), dtype=tl.int64)
    for chunk in range(COUNT):
        columns = chunk * CHUNK + tl.arange(0, CHUNK)
        x = tl.load(row_logits + columns, mask=columns < vocab, other=-float("inf"))
        above = (key(x.to(tl.float32)) >= threshold) & (columns < vocab)
        count += tl.sum(above.to(tl.int64), 0)
    return count


@triton.jit
def _mass_from(row_logits, vocab, threshold, top, temperature, CHUNK: tl.constexpr,
               COUNT: tl.constexpr):
    """Sum of exp((x - top) / T) over the row's logits with a key >= threshold (float64)."""
    mass = tl.zeros((), dtype=tl.float64)
    for chunk in range(COUNT):
        columns = chunk * CHUNK + tl.arange(0, CHUNK)
        x = tl.load(row_logits + columns, mask=columns < vocab,
                    other=-float("inf")).to(tl.float32)
        weight = tl.where(key(x) >= threshold, tl.exp((x - top) / temperature), 0.0)
        mass += tl.sum(weight, 0).to(tl.float64)
    return mass


@triton.jit
def _kth_largest(row_logits, vocab, top, top_k, CHUNK: tl.constexpr, COUNT: tl.constexpr):
    """The key of the row's top_k-th largest logit: the largest key with at least top_k
    logits at or above it."""
    low = tl.full((), _KEY_LOW, tl.int64)
    high = key(top).to(tl.int64)
    for _ in range(32):
        if low < high:
            middle = low + (high - low + 1) // 2
            if _count_from(row_logits, vocab, middle, CHUNK, COUNT) >= top_k:
                low = middle
            else:
                high = middle - 1
    return low


@triton.jit
def _nucleus_cut(row_logits, vocab, low, top, temperature, top_p, CHUNK: tl.constexpr,
                 COUNT: tl.constexpr):
    """The key where the descending mass of the logits at or above key `low` first reaches
    top_p of theirs: the largest key whose mass reaches it."""
    goal = top_p * _mass_from(row_logits, vocab, low, top, temperature, CHUNK, COUNT)
    high = key(top).to(tl.int64)
    for _ in range(32):
        if low < high:
            middle = low + (high - low + 1) // 2
            if _mass_from(row_logits, vocab, middle, top, temperature, CHUNK, COUNT) >= goal:
                low = middle
            else:
                high = middle - 1
    return low


@triton.jit
def _keep(x, columns, vocab, threshold, top, temperature, log_min_p, MIN_P: tl.constexpr):
    """The kept logits among `x`: inside the row, key >= threshold, and the min-p test."""
    keep = (columns < vocab) & (key(x) >= threshold)
    if MIN_P:
        keep = keep & ((x - top) / temperature >= log_min_p)
    return keep


@triton.jit
def filter_chunks(row_logits, vocab, top, temperature, top_k, top_p, log_min_p, maxima, sums,
                  CHUNK: tl.constexpr, COUNT: tl.constexpr, TOP_K: tl.constexpr,
                  TOP_P: tl.constexpr, MIN_P: tl.constexpr):
    """Find the row's kept set and write its chunk statistics (`maxima`, `sums`: the row's
    own); returns the key threshold the draw applies with the min-p test."""
    threshold = tl.full((), _KEY_LOW, tl.int64)
    if TOP_K:
        threshold = _kth_largest(row_logits, vocab, top, top_k, CHUNK, COUNT)
    if TOP_P:
        threshold = _nucleus_cut(row_logits, vocab, threshold, top, temperature, top_p, CHUNK,
                                 COUNT)
    for chunk in range(COUNT):
        columns = chunk * CHUNK + tl.arange(0, CHUNK)
        x = tl.load(row_logits + columns, mask=columns < vocab,
                    other=-float("inf")).to(tl.float32)
        keep = _keep(x, columns, vocab, threshold, top, temperature, log_min_p, MIN_P)
        largest = tl.max(tl.where(keep, x, -float("inf")), 0)
        total = tl.sum(tl.where(keep, tl.exp((x - largest) / temperature), 0.0), 0)
        tl.store(maxima + chunk, largest)
        tl.store(sums + chunk, tl.where(largest == -float("inf"), 0.0, total))
    tl.debug_barrier()  # the draw reads back what other threads wrote
    return threshold


@triton.jit
def draw(row_logits, vocab, top, temperature, threshold, log_min_p, maxima, sums, u_chunk,
         u_token, CHUNKS: tl.constexpr, CHUNK: tl.constexpr, COUNT: tl.constexpr,
         MIN_P: tl.constexpr):
    """(token, processed_logp) from the row's chunk statistics: a chunk by the chunks'
    masses, then a token by its weights."""
    slots = tl.arange(0, CHUNKS)
    largest = tl.load(maxima + slots, mask=slots < COUNT, other=-float("inf"))
    total = tl.load(sums + slots, mask=slots < COUNT, other=0.0)
    relative = tl.exp(((largest - top) / temperature).to(tl.float64))
    masses = tl.where(largest == -float("inf"), 0.0, total.to(tl.float64) * relative)
    chunk = pick(masses, u_chunk)
    base = tl.sum(tl.where(slots == chunk, largest, 0.0), 0)
    columns = chunk * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(row_logits + columns, mask=columns < vocab, other=-float("inf")).to(tl.float32)
    keep = _keep(x, columns, vocab, threshold, top, temperature, log_min_p, MIN_P)
    weights = tl.where(keep, tl.exp((x - base) / temperature), 0.0).to(tl.float64)
    position = pick(weights, u_token)
    drawn = tl.sum(tl.where(tl.arange(0, CHUNK) == position, x, 0.0), 0)
    scaled = (drawn.to(tl.float64) - top.to(tl.float64)) / temperature
    return chunk * CHUNK + position, scaled - tl.log(tl.sum(masses, 0))


@triton.jit
def first_largest(row_logits, vocab, top, largest, CHUNKS: tl.constexpr, CHUNK: tl.constexpr):
    """The greedy token: the first position of the row's largest logit `top` (finite), found
    in the first chunk whose largest (`largest`, per chunk) it is, as torch.argmax picks."""
    slots = tl.arange(0, CHUNKS)
    chunk = tl.min(tl.where(largest == top, slots, CHUNKS), 0)
    columns = chunk * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(row_logits + columns, mask=columns < vocab, other=-float("inf")).to(tl.float32)
    return chunk * CHUNK + tl.min(tl.where(x == top, tl.arange(0, CHUNK), CHUNK), 0)
