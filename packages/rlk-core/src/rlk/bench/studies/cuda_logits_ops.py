"""Host time against wall time of rlk.logp and rlk.sample on a CUDA device.

Rows: rlk.logp forward and forward+backward (cuda backend; bfloat16 and float16; N=8192 at
V=32768 and V=128256), rlk.sample on the cuda and flashinfer backends (B=64 and 256,
V=128256; no filter, and top_k=50 top_p=0.9; per-row seeds made before the loop) and
FlashInfer's own sampling_from_logits at B=64 for reference. `--profile` adds a cProfile
of rlk.logp fwd+bwd (bfloat16, V=32768) by own time. Needs rlk-cuda and a GPU.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

import rlk
from rlk.bench.studies import host

DEVICE = torch.device("cuda")
N, SAMPLE_VOCAB = 8192, 128256


def _report(name: str, call: Callable[[], object], reps: int) -> None:
    print(host.line(name, call, reps, DEVICE, warmup=5))


def _logp_pair(name: str, logits: torch.Tensor, tokens: torch.Tensor, reps: int,
               profile: bool) -> None:
    """rlk.logp forward, and forward+backward, on the cuda backend."""
    leaf = logits.clone().requires_grad_(True)
    upstream = torch.ones(tokens.shape, device=DEVICE)

    def step() -> object:
        return torch.autograd.grad(rlk.logp(leaf, tokens), leaf, upstream)

    with rlk.use_backends("cuda", strict=True):
        _report(f"rlk.logp fwd {name}", lambda: rlk.logp(logits, tokens), reps)
        _report(f"rlk.logp fwd+bwd {name}", step, reps)
        if profile:
            host.profile(step, 100, 8)


def _logp_rows(gen: torch.Generator, profile: bool) -> None:
    for vocab in (32768, 128256):
        tokens = torch.randint(0, vocab, (N,), device=DEVICE, generator=gen)
        for dtype in (torch.bfloat16, torch.float16):
            logits = torch.randn(N, vocab, device=DEVICE, generator=gen).to(dtype)
            _logp_pair(f"V={vocab} {str(dtype).replace('torch.', '')}", logits, tokens,
                       100 if vocab <= 32768 else 30,
                       profile and vocab == 32768 and dtype == torch.bfloat16)
            del logits


def _sample_rows(gen: torch.Generator) -> None:
    filters: dict[str, dict[str, Any]] = {"no filter": {},
                                          "top_k=50 top_p=0.9": {"top_k": 50, "top_p": 0.9}}
    for batch in (64, 256):
        logits = torch.randn(batch, SAMPLE_VOCAB, device=DEVICE, generator=gen) * 3
        seeds = torch.randint(0, 2**62, (batch,), device=DEVICE, generator=gen)
        for backend in ("cuda", "flashinfer"):
            for label, options in filters.items():
                with rlk.use_backends(backend, strict=True):
                    _report(f"rlk.sample {backend} B={batch} {label}",
                            functools.partial(rlk.sample, logits, seed=seeds, **options), 200)
    try:
        import flashinfer.sampling
    except ImportError as exc:
        print(f"flashinfer.sampling unavailable: {exc}")
        return
    logits = torch.randn(64, SAMPLE_VOCAB, device=DEVICE, generator=gen) * 3
    _report("flashinfer sampling_from_logits B=64",
            functools.partial(flashinfer.sampling.sampling_from_logits, logits), 200)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Host against wall time of rlk.logp, rlk.sample")
    parser.add_argument("--profile", action="store_true", help="cProfile logp fwd+bwd")
    profile = parser.parse_args(argv).profile
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    _logp_rows(gen, profile)
    _sample_rows(gen)
    return 0
