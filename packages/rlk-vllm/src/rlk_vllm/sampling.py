"""The `vllm` backend's `sample` kernel: vLLM's own sampling ops behind rlk's kernel signature.

A trainer that samples through this kernel draws the token vLLM's engine would
draw from the same logits and seed: each row's seed seeds a torch.Generator, as
vLLM seeds a request's generator, and the draw goes through the op the engine
uses on that device (the fused Gumbel-max kernel on x86/Arm CPUs, exponential
noise from the generator elsewhere). Filters run in rlk's documented order:
temperature, top-k, top-p (vLLM's `apply_top_k_top_p`), then min-p.
"""

from __future__ import annotations

from typing import Any

import torch

from rlk.backend import drawn_logp, overflow_safe
from rlk_vllm._vllm import require_vllm

_UINT64 = (1 << 64) - 1


def _vllm_ops() -> Any:
    """vLLM's sampling module, with its compiled ops loaded (imported on first call)."""
    require_vllm("the `vllm` sample backend", "vllm._custom_ops")
    return require_vllm("the `vllm` sample backend", "vllm.v1.sample.ops.topk_topp_sampler")


def _generators(seeds: torch.Tensor, device: torch.device) -> dict[int, torch.Generator]:
    """One generator per row, seeded like vLLM seeds a request's generator."""
    gens = {}
    for row, seed in enumerate(seeds.tolist()):
        gen = torch.Generator(device=device)
        gen.manual_seed(int(seed) & _UINT64)
        gens[row] = gen
    return gens


def _truncate(x: torch.Tensor, top_k: int, top_p: float, min_p: float, ops: Any) -> torch.Tensor:
    """Mask filtered tokens of the temperature-scaled float32 logits `x` with -inf."""
    rows, vocab = x.shape
    k = None
    if 0 < top_k < vocab:
        k = torch.full((rows,), top_k, dtype=torch.int32, device=x.device)
    p = None if top_p >= 1.0 else torch.full((rows,), top_p, dtype=torch.float32, device=x.device)
    if k is not None or p is not None:
        kept = ops.apply_top_k_top_p(x.clone(), k, p)
        # vLLM cuts top-p at a sort position, so of two tokens tied at the cut it may keep
        # one; rlk keeps every token tied with the last one kept. Both filters keep a set
        # of the largest values, so "at least the smallest kept value" is that set.
        floor = kept.masked_fill(kept == float("-inf"), float("inf")).amin(dim=-1, keepdim=True)
        x = x.masked_fill(x < floor, float("-inf"))
    if min_p > 0.0:
        probs = x.softmax(dim=-1)
        x = x.masked_fill(probs < probs.amax(dim=-1, keepdim=True) * min_p, float("-inf"))
    return x


def _draw(x: torch.Tensor, seeds: torch.Tensor, ops: Any) -> torch.Tensor:
    """One token per row from softmax(x), keyed by each row's seed only."""
    gens = _generators(seeds, x.device)
    fused = getattr(torch.ops._C, "fused_gumbel_argmax", None) if x.device.type == "cpu" else None
    if fused is not None:
        # vLLM's CPU path: one 31-bit draw from the request's generator seeds the noise.
        step = torch.tensor(
            [int(torch.randint(0, 2**31, (1,), generator=g).item()) for g in gens.values()],
            dtype=torch.int64,
        )
        drawn: torch.Tensor = fused(x.contiguous(), step)
    else:
        drawn = ops.random_sample(x.softmax(dim=-1, dtype=torch.float32), gens)
    return drawn.to(torch.int64)


def sample(
    logits: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    seeds: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """rlk's `sample` kernel: (tokens [B] int64, logp [B] f32, processed_logp [B] f32).

    `logp` comes from `rlk.logp` on the same logits (temperature 1 when greedy), so it
    equals what the trainer computes bit for bit. Rows without a valid token (all -inf,
    any NaN or +inf) give token -1 and NaN log-probs.
    """
    ops = _vllm_ops()
    x = logits.to(torch.float32)
    valid = torch.isfinite(torch.logsumexp(x, dim=-1))  # no NaN, no +inf, not all -inf
    x = torch.where(valid[:, None], x, torch.zeros((), dtype=x.dtype, device=x.device))
    greedy = temperature == 0.0
    if greedy:
        sampler = require_vllm("the `vllm` sample backend", "vllm.v1.sample.sampler")
        tokens = sampler.Sampler.greedy_sample(x).to(torch.int64)
        processed = torch.zeros(x.shape[0], dtype=torch.float32, device=x.device)
    else:
        # x / T as vLLM's engine divides, except where a tiny T would overflow into NaN
        safe, scale = overflow_safe(x, temperature)
        x = _truncate(safe / scale, top_k, top_p, min_p, ops)
        tokens = _draw(x, seeds, ops)
        processed = x.log_softmax(dim=-1).gather(1, tokens[:, None]).squeeze(1)
    tokens = torch.where(valid, tokens, torch.full_like(tokens, -1))
    nan = torch.tensor(float("nan"), device=x.device)
    # `vllm` has no logp kernel of its own: the caller's logp backend serves it
    return tokens, drawn_logp(logits, tokens, temperature), torch.where(valid, processed, nan)
