"""Native sample: filters in log space, then an exponential race keyed by a counter-based hash.

Each row draws token j with probability q_j (the truncated, renormalised
distribution) by taking argmax_j (log q_j - log E_j), E_j = -log u_j, where u_j is
a hash of (the row's seed, j). No generator state is involved, so a row's token
depends only on its logits and its seed, never on its position in the batch.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rlk._runtime.chunks import rows_per_chunk

_MASK32 = 0xFFFFFFFF
# float32-wide buffers alive per row: the scaled logits, the keep mask and scores,
# and the int64 temporaries of the hash (two float32 widths each).
_LIVE = 10


def _mul32(x: Tensor, constant: int) -> Tensor:
    """(x * constant) mod 2**32 for x in [0, 2**32), in int64 without overflow."""
    low, high = constant & 0xFFFF, constant >> 16
    return (x * low + (((x * high) & 0xFFFF) << 16)) & _MASK32


def hash32(x: Tensor) -> Tensor:
    """A 32-bit integer mixer (xorshift-multiply, two rounds) on int64 values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def uniforms(seeds: Tensor, vocab: int) -> Tensor:
    """u[b, j] in (0, 1) as float32, a function of (seeds[b], j) only."""
    low, high = seeds & _MASK32, (seeds >> 32) & _MASK32
    key = hash32(low ^ hash32(high ^ 0x5BD1E995)).unsqueeze(1)
    salt = hash32(key ^ 0x27D4EB2F)
    counters = torch.arange(vocab, dtype=torch.int64, device=seeds.device)
    return unit_interval(hash32((hash32(counters ^ key) + salt) & _MASK32))


def unit_interval(bits: Tensor) -> Tensor:
    """32 random bits -> float32 strictly inside (0, 1).

    23 bits plus one half is exact in float32; 24 bits plus one half rounds the top
    value to exactly 1.0, whose Gumbel noise is infinite and lets a filtered-out
    token (-inf - -inf = NaN, which argmax takes) win the race.
    """
    return ((bits >> 9).to(torch.float32) + 0.5) * (1.0 / (1 << 23))


def _keep(x: Tensor, top_k: int, top_p: float, min_p: float) -> Tensor | None:
    """Which tokens survive top-k, then top-p, then min-p (None: every token). Ties are kept."""
    vocab = x.shape[1]
    keep = None
    if 0 < top_k < vocab:
        kth = torch.topk(x, top_k, dim=1).values[:, -1:]
        keep = x >= kth
    if top_p < 1.0:
        masked = x if keep is None else x.masked_fill(~keep, -torch.inf)
        ordered = torch.sort(masked, dim=1, descending=True).values
        weights = (ordered - ordered[:, :1]).exp_()
        mass = weights.cumsum(dim=1)
        before = mass - weights  # mass strictly ahead of each sorted token
        count = (before < top_p * mass[:, -1:]).sum(dim=1, keepdim=True).clamp(min=1)
        cut = ordered.gather(1, count - 1)
        keep = masked >= cut
    if min_p > 0.0:
        floor = x.amax(dim=1, keepdim=True) + math.log(min_p)
        keep = (x >= floor) if keep is None else keep & (x >= floor)
    return keep


def sample(logits: Tensor, temperature: float, top_k: int, top_p: float, min_p: float,
           seeds: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    from rlk.ops.logp.op import LOGP

    batch, vocab = logits.shape
    tokens = torch.empty(batch, dtype=torch.int64, device=logits.device)
    processed = torch.empty(batch, dtype=torch.float32, device=logits.device)
    step = rows_per_chunk(vocab, _LIVE)
    for start in range(0, batch, step):
        stop = min(batch, start + step)
        x = logits[start:stop].to(torch.float32, copy=True)
        valid = torch.isfinite(torch.logsumexp(x, dim=1))
        if temperature == 0.0:
            chosen = x.argmax(dim=1)
            kept_lse = x.gather(1, chosen.unsqueeze(1)).squeeze(1)  # a point mass
        else:  # shifted by the row's max first: x / T alone overflows for tiny T
            top = x.amax(dim=1, keepdim=True)
            x.sub_(torch.where(torch.isfinite(top), top, 0.0)).div_(temperature)
            keep = _keep(x, top_k, top_p, min_p)
            if keep is not None:
                x.masked_fill_(~keep, -torch.inf)
            kept_lse = torch.logsumexp(x, dim=1)
            race = uniforms(seeds[start:stop], vocab).log_().neg_().log_()
            chosen = (x - race).argmax(dim=1)
        picked = x.gather(1, chosen.unsqueeze(1)).squeeze(1)
        tokens[start:stop] = torch.where(valid, chosen, -1)
        processed[start:stop] = torch.where(valid, picked - kept_lse, torch.nan)
    args = {"logits": logits, "tokens": tokens, "temperature": temperature or 1.0,
            "ignore_index": -100, "rows": None, "out": None, "with_entropy": False}
    logp, _, _ = LOGP.kernel(args).forward(**args)
    return tokens, logp, processed
