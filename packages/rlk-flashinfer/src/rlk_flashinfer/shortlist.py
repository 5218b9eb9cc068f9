"""Rows whose kept set lies among their K largest logits: filters and draw there, in float64.

FlashInfer's radix top-k gives each row its K largest logits, K set by top_k and V alone.
When every token the filters keep is among them (checked per row: the smallest of the K lies
strictly below the cut that bounds the kept set), the filters, the draw and processed_logp
need nothing else. A top-k cut bounds the set whenever its ties fit among the K; with top_k
off, a top-p nucleus or a min-p floor reached among the K does (a min-p floor also does
under top-k when top-p is off: top-p is relative to the top-k set's mass, which needs that
whole set). Rows whose kept set may reach past the K take the full-vocabulary path; which
path a row takes depends only on its logits, so its token never depends on the batch.

The K entries are sorted here by (value descending, index ascending), one int64 key each,
so that the order in which the radix top-k returns tied logits does not matter.
"""

from __future__ import annotations

import triton
import triton.language as tl

from rlk_flashinfer.draw import key, pick, value

MIN_SIZE = 1024  # shortlist for top-p and min-p without top-k
TIE_ROOM = 64  # shortlist entries beyond top_k, for ties at the k-th logit
MAX_TOP_K = 4096  # above this, every row takes the full-vocabulary path


def size(vocab: int, top_k: int, top_p: float, min_p: float) -> int | None:
    """Shortlist length for these filters, or None when no filter can bound the kept set."""
    if top_k > MAX_TOP_K or (top_k == 0 and top_p == 1.0 and min_p == 0.0):
        return None
    return min(vocab, max(MIN_SIZE, top_k + TIE_ROOM))


@triton.jit
def draw(values, indices, row, size, vocab, temperature, top_k, top_p, log_min_p, mass, u,
         BLOCK: tl.constexpr, TOP_K: tl.constexpr, TOP_P: tl.constexpr, MIN_P: tl.constexpr):
    """(fits, token, processed_logp) of one row from its `size` shortlist entries (`values`,
    `indices` [R, size], any order). `mass`: the whole softmax's mass relative to the row's
    largest logit (float64), for top-p without top-k. A row that does not fit gets
    meaningless values."""
    offs = tl.arange(0, BLOCK)
    inside = offs < size
    at = row.to(tl.int64) * size + offs
    raw = tl.load(values + at, mask=inside, other=0.0).to(tl.float32)
    index = tl.load(indices + at, mask=inside, other=0).to(tl.int64)
    # ascending int64 order = value descending, then index ascending
    packed = ((~key(raw)).to(tl.int64) << 32) | index
    packed = tl.sort(tl.where(inside, packed, 0x7FFFFFFFFFFFFFFF), 0)
    index = packed & 0xFFFFFFFF
    scaled = value(~((packed >> 32).to(tl.int32))).to(tl.float64) / temperature
    top = tl.max(tl.where(inside, scaled, -float("inf")), 0)
    weight = tl.where(inside, tl.exp(scaled - top), 0.0)
    smallest = tl.min(tl.where(inside, scaled, float("inf")), 0)
    fits = size == vocab
    keep = inside
    if TOP_K:
        kth = tl.sum(tl.where(offs == top_k - 1, scaled, 0.0), 0)
        keep = keep & (scaled >= kth)
        fits = fits | (smallest < kth)
    if TOP_P:
        kept = tl.where(keep, weight, 0.0)
        if TOP_K:
            mass = tl.sum(kept, 0)
        reached = tl.cumsum(kept, 0) >= top_p * mass
        found = tl.sum(reached.to(tl.int32), 0) > 0
        first = tl.min(tl.where(reached, offs, BLOCK), 0)
        cut = tl.sum(tl.where(offs == first, scaled, 0.0), 0)
        keep = keep & ((scaled >= cut) | ~found)  # not found: the nucleus holds all K
        if not TOP_K:
            fits = fits | (found & (smallest < cut))
    if MIN_P:
        floor = top + log_min_p
        keep = keep & (scaled >= floor)
        if (not TOP_K) or (not TOP_P):  # else top-p needs the whole top-k set's mass
            fits = fits | (smallest < floor)
    kept = tl.where(keep, weight, 0.0)
    position = pick(kept, u)
    chosen = offs == position
    token = tl.sum(tl.where(chosen, index, 0), 0)
    processed = tl.log(tl.sum(tl.where(chosen, kept, 0.0), 0)) - tl.log(tl.sum(kept, 0))
    return fits, token, processed
