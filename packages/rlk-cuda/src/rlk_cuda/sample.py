"""The `sample` kernel: temperature, top-k, top-p and min-p from logits with per-row seeds.

Its first pass is this backend's logp forward (statistics only, on the same kernel choice),
so the returned logp equals `logp(logits, tokens, temperature=T)` on this backend bit for
bit. Both passes launch from one extension call, into four allocations (the three outputs
and one scratch buffer): at small batches the host path is the whole cost of a call.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import _ext
from ._launch import device_of, dtype_code, f32_empty, ptr, rows_major, same_device, stream
from .logp import forward_segments


def sample(
    logits: Tensor, temperature: float, top_k: int, top_p: float, min_p: float, seeds: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """One token per row; returns (tokens int64, logp f32, processed_logp f32)."""
    device = device_of("logits", logits)
    code = dtype_code("logits", logits)
    same_device("seeds", seeds, device)
    logits = rows_major(logits)
    batch, vocab = logits.shape
    where = logits.device
    tokens = torch.empty(batch, dtype=torch.int64, device=where)
    logp = f32_empty(batch, device=where)
    processed = f32_empty(batch, device=where)
    if batch == 0:
        return tokens, logp, processed
    tma, segments = forward_segments(device, vocab)
    # [2, B] row statistics, then the forward's [B, segments, 3] partial statistics
    scratch = f32_empty(batch * (2 + 3 * segments), device=where)
    seeds = seeds.to(torch.int64).contiguous()
    stats = ptr(scratch)
    ext = _ext.load()
    args = ext.SampleArgs(
        logits=ptr(logits),
        dtype=code,
        B=batch,
        V=vocab,
        row_stride=logits.stride(0),
        temperature=float(temperature),
        top_k=int(top_k),
        top_p=float(top_p),
        min_p=float(min_p),
        seeds=ptr(seeds),
        stats=stats,
        nseg=segments,
        partial=stats + 4 * 2 * batch,
        tma=tma,
        tokens=ptr(tokens),
        logp=ptr(logp),
        processed_logp=ptr(processed),
    )
    ext.sample(device=device, stream=stream(device), args=args)
    return tokens, logp, processed
