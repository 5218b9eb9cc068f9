"""Pre-warm the backend's kernels: `python -m rlk_flashinfer.warmup [--device cuda:0]`.

The first call compiles FlashInfer's top-k module with nvcc (no prebuilt module) and the
backend's Triton kernels for the filters used; running this once per machine (or image
build) moves that cost out of training. Triton compiles again per vocabulary size (a
kernel constant), into its own cache (~/.triton/cache).
"""

from __future__ import annotations

import argparse
import time

import torch

from rlk_flashinfer.sampler import sample


def warmup(device: str | torch.device = "cuda") -> float:
    """Run every kernel the backend uses on a tiny batch; return the seconds taken."""
    target = torch.device(device)
    began = time.perf_counter()
    peaked = torch.randn(2, 2048, device=target) * 3  # served from the shortlist (top-k)
    flat = torch.zeros(2, 2048, device=target)  # every filter keeps it all: full vocabulary
    seeds = torch.tensor([1, 2], dtype=torch.int64, device=target)
    for logits in (peaked, flat):
        sample(logits, 0.7, 16, 0.9, 0.05, seeds)
    sample(peaked, 0.7, 0, 1.0, 0.0, seeds)  # plain sampling
    sample(peaked, 0.0, 0, 1.0, 0.0, seeds)  # greedy
    torch.cuda.synchronize(target)
    return time.perf_counter() - began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="CUDA device to warm (default: cuda)")
    seconds = warmup(parser.parse_args(argv).device)
    print(f"flashinfer sampling kernels ready in {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
