"""Host time against wall time of rlk.logp and rlk.sample on a CUDA device.

Host ms: the Python and launch cost per call (no sync inside the loop); wall ms: per call
once the device has drained. A call whose host time nears its wall time is host-bound.
Rows: rlk.logp forward and forward+backward (cuda backend; bfloat16 and float16; N=8192 at
V=32768 and V=128256), rlk.sample on the cuda and flashinfer backends (B=64 and 256,
V=128256; no filter, and top_k=50 top_p=0.9; per-row seeds made before the loop) and
FlashInfer's own sampling_from_logits at B=64 for reference. `--profile` adds a cProfile
of rlk.logp fwd+bwd (bfloat16, V=32768) by own time.
  python benchmarks/cuda/logits_ops_host_time.py [--profile]   (needs rlk-cuda and a GPU)
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import pstats
from collections.abc import Callable
from typing import Any

import torch

import rlk
from rlk.bench.timing import host_and_wall_ms

DEVICE = torch.device("cuda")
N, SAMPLE_VOCAB = 8192, 128256


def report(name: str, call: Callable[[], object], reps: int) -> None:
    try:
        host, wall = host_and_wall_ms(call, reps, DEVICE, warmup=5)
    except Exception as exc:  # a missing backend or peer is a row, not the end of the run
        first = (str(exc).splitlines() or [""])[0][:80]
        print(f"{name:46s} failed: {type(exc).__name__}: {first}")
        return
    print(f"{name:46s} host {host:.4f} ms  wall {wall:.4f} ms")


def logp_pair(name: str, logits: torch.Tensor, tokens: torch.Tensor, reps: int,
              profile: bool) -> None:
    """rlk.logp forward, and forward+backward, on the cuda backend."""
    leaf = logits.clone().requires_grad_(True)
    upstream = torch.ones(tokens.shape, device=DEVICE)

    def step() -> object:
        return torch.autograd.grad(rlk.logp(leaf, tokens), leaf, upstream)

    with rlk.use_backends("cuda", strict=True):
        report(f"rlk.logp fwd {name}", lambda: rlk.logp(logits, tokens), reps)
        report(f"rlk.logp fwd+bwd {name}", step, reps)
        if profile:
            profiler = cProfile.Profile()
            profiler.runcall(lambda: [step() for _ in range(100)])
            torch.cuda.synchronize()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(8)


def logp_rows(gen: torch.Generator, profile: bool) -> None:
    for vocab in (32768, 128256):
        tokens = torch.randint(0, vocab, (N,), device=DEVICE, generator=gen)
        for dtype in (torch.bfloat16, torch.float16):
            logits = torch.randn(N, vocab, device=DEVICE, generator=gen).to(dtype)
            logp_pair(f"V={vocab} {str(dtype).replace('torch.', '')}", logits, tokens,
                      100 if vocab <= 32768 else 30,
                      profile and vocab == 32768 and dtype == torch.bfloat16)
            del logits


def sample_rows(gen: torch.Generator) -> None:
    filters: dict[str, dict[str, Any]] = {"no filter": {},
                                            "top_k=50 top_p=0.9": {"top_k": 50, "top_p": 0.9}}
    for batch in (64, 256):
        logits = torch.randn(batch, SAMPLE_VOCAB, device=DEVICE, generator=gen) * 3
        seeds = torch.randint(0, 2**62, (batch,), device=DEVICE, generator=gen)
        for backend in ("cuda", "flashinfer"):
            for label, options in filters.items():
                with rlk.use_backends(backend, strict=True):
                    report(f"rlk.sample {backend} B={batch} {label}",
                           functools.partial(rlk.sample, logits, seed=seeds, **options), 200)
    try:
        import flashinfer.sampling
    except ImportError as exc:
        print(f"flashinfer.sampling unavailable: {exc}")
        return
    logits = torch.randn(64, SAMPLE_VOCAB, device=DEVICE, generator=gen) * 3
    report("flashinfer sampling_from_logits B=64",
           functools.partial(flashinfer.sampling.sampling_from_logits, logits), 200)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="store_true", help="cProfile logp fwd+bwd")
    profile = parser.parse_args().profile
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    logp_rows(gen, profile)
    sample_rows(gen)


if __name__ == "__main__":
    main()
