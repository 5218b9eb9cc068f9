"""Wall time per call of small-batch rlk.sample and rlk.logp on rlk:cuda, called eagerly and
replayed from a CUDA graph of one call, beside FlashInfer's fused sampler (the bench's peer)
both ways (issue #29 item 2).

Per call: the median over 5 loops of 200 calls (or replays) of the loop's wall time, the
GPU drained before and after each loop; so host cost that the GPU does not hide counts.
Usage (GPU machine, rlk-cuda and flashinfer installed): python tools/gpu/capture_times.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

import rlk
from rlk.bench.workloads import sample as sample_workload

DEVICE = torch.device("cuda")
ROWS = 64


def wall_us(call: Callable[[], object], loops: int = 5, reps: int = 200) -> float:
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    times = []
    for _ in range(loops):
        start = time.perf_counter()
        for _ in range(reps):
            call()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / reps * 1e6)
    return statistics.median(times)


def replayed(call: Callable[[], object]) -> Callable[[], object]:
    """A CUDA graph of one call (warmed up on a side stream first), as its replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph.replay


def row(label: str, call: Callable[[], object]) -> str:
    try:
        eager, graph = wall_us(call), wall_us(replayed(call))
    except Exception as exc:  # a peer that cannot run or capture costs one row
        return f"| {label} | {type(exc).__name__}: {str(exc)[:80]} | |"
    return f"| {label} | {eager:.1f} | {graph:.1f} |"


def config_rows(vocab: int, dtype: torch.dtype) -> None:
    case = sample_workload.case(ROWS, vocab, sample_workload.PLAIN)
    x = sample_workload.make_inputs(case, dtype, DEVICE, seed=0, backward=False)
    logits, seeds = x["logits"], x["seed"]
    tokens = torch.randint(0, vocab, (ROWS,), device=DEVICE)
    name = f"V={vocab} {str(dtype).replace('torch.', '')}"
    with rlk.use_backends("cuda", strict=True):
        print(row(f"rlk.sample {name}", lambda: rlk.sample(logits, seed=seeds)))
        print(row(f"rlk.sample top-k 50 top-p 0.9 {name}",
                  lambda: rlk.sample(logits, top_k=50, top_p=0.9, seed=seeds)))
        print(row(f"rlk.logp {name}", lambda: rlk.logp(logits, tokens)))
    try:
        peer = sample_workload._flashinfer(case, False, DEVICE)
    except Exception as exc:
        print(f"| FlashInfer sampling_from_logits {name} | blocked: {exc} | |")
        return
    print(row(f"FlashInfer sampling_from_logits {name}", lambda: peer(x)))


def main() -> None:
    print("| call (B=64) | eager µs/call | replayed µs/call |")
    print("| --- | --- | --- |")
    for vocab in (128256, 256000):
        for dtype in (torch.bfloat16, torch.float32):
            config_rows(vocab, dtype)


if __name__ == "__main__":
    main()
