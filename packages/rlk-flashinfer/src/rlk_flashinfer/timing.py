"""Quick GPU timing of the flashinfer `sample` kernel beside torch eager (and other rlk backends).

`python -m rlk_flashinfer.timing [--batch 256] [--vocab 151936]` prints one JSON line per
row: median milliseconds over CUDA events after warm-up. The first line is the first
call's wall time (FlashInfer's JIT build or module load). For the full suite use
`rlk-core bench`; this exists to size the seed-grouping cost on a new machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from rlk_flashinfer.sampler import sample

TEMPERATURE, TOP_K, TOP_P = 0.8, 50, 0.95


def torch_eager(logits: torch.Tensor) -> torch.Tensor:
    """The peer: the same filters in plain PyTorch, torch's global generator, one kernel chain."""
    probs = torch.softmax(logits.float() / TEMPERATURE, dim=-1)
    kth = probs.topk(TOP_K, dim=-1).values[:, -1:]
    probs = probs * (probs >= kth)
    ordered, order = probs.sort(dim=-1, descending=True)
    keep = (ordered.cumsum(-1) - ordered) < TOP_P * ordered.sum(-1, keepdim=True)
    probs = probs * torch.zeros_like(keep).scatter(-1, order, keep)
    return torch.multinomial(probs, 1)[:, 0]


def median_ms(run: Callable[[], object], repeats: int = 20, warmup: int = 3) -> float:
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return float(statistics.median(times))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=151936)
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    logits = torch.randn(args.batch, args.vocab, device=device).mul(3).to(torch.bfloat16)
    consecutive = torch.arange(args.batch, dtype=torch.int64) + (1 << 40)
    scattered = torch.randint(-(2**62), 2**62, (args.batch,), dtype=torch.int64)

    began = time.perf_counter()
    sample(logits[:2], TEMPERATURE, TOP_K, TOP_P, 0.0, consecutive[:2])
    torch.cuda.synchronize(device)
    print(json.dumps({"row": "first call (JIT build or load)",
                      "seconds": round(time.perf_counter() - began, 2)}))

    shape = {"batch": args.batch, "vocab": args.vocab, "dtype": "bfloat16",
             "device": torch.cuda.get_device_name(device)}
    rows: dict[str, Callable[[], object]] = {
        "flashinfer, consecutive seeds": lambda: sample(
            logits, TEMPERATURE, TOP_K, TOP_P, 0.0, consecutive),
        "flashinfer, random seeds": lambda: sample(
            logits, TEMPERATURE, TOP_K, TOP_P, 0.0, scattered),
        "flashinfer, min_p 0.05": lambda: sample(
            logits, TEMPERATURE, TOP_K, TOP_P, 0.05, consecutive),
        "torch eager": lambda: torch_eager(logits),
    }
    for name, run in rows.items():
        print(json.dumps({"row": name, "median_ms": round(median_ms(run), 3), **shape}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
