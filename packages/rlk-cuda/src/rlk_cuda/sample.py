"""The `sample` kernel: temperature, top-k, top-p and min-p from logits with per-row seeds.

The first pass is this backend's logp forward kernel (statistics only), so the returned logp
equals `logp(logits, tokens, temperature=T)` on this backend bit for bit.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import _ext
from ._launch import device_of, dtype_code, f32_empty, ptr, rows_major, same_device, stream
from .logp import launch_forward


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
    tokens = torch.empty(batch, dtype=torch.int64, device=logits.device)
    logp = f32_empty(batch, device=where)
    processed = f32_empty(batch, device=where)
    if batch == 0:
        return tokens, logp, processed
    greedy = not temperature > 0.0
    stats = f32_empty(2, batch, device=where)
    launch_forward(
        logits, None, 1.0 if greedy else float(temperature), -100, None, None, None, None, stats
    )
    seeds = seeds.to(torch.int64).contiguous()
    _ext.load().sample(
        device=device,
        stream=stream(device),
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
        stats=ptr(stats),
        tokens=ptr(tokens),
        logp=ptr(logp),
        processed_logp=ptr(processed),
    )
    return tokens, logp, processed
