"""rlk.logp on the cuda backend: GPU time apart from host time, forward and forward+backward.

bench = median of per-call CUDA events with the host never waiting (as rlk-core bench times);
gpu = calls queued behind a sleeping kernel, so the GPU never waits for the host; host = host
time per call. bench >> gpu means the row is host-bound. % = of a copy's bandwidth.
"""

import statistics
import sys
import time

import torch

import rlk

N = 8192
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def copy_gbps() -> float:
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(10):
        y.copy_(x)
    e.record()
    torch.cuda.synchronize()
    return 2 * x.numel() * 10 / (s.elapsed_time(e) * 1e6)


def bench_ms(call, reps=40):
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        call()
        stops[i].record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in zip(starts, stops, strict=True))


def queued_ms(call, reps=20):
    """(gpu ms, host ms) per call, the calls queued behind a 60 ms sleep."""
    torch.cuda.synchronize()
    torch.cuda._sleep(120_000_000)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    began = time.perf_counter()
    s.record()
    for _ in range(reps):
        call()
    e.record()
    host = (time.perf_counter() - began) * 1e3 / reps
    torch.cuda.synchronize()
    return s.elapsed_time(e) / reps, host


def rows(name: str, dtype: torch.dtype, vocab: int, copy: float) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(N, vocab, generator=gen, device="cuda") * 2).to(dtype)
    tokens = torch.randint(0, vocab, (N,), generator=gen, device="cuda")
    g = torch.randn(N, device="cuda")
    leaf = logits.detach().requires_grad_(True)
    size = logits.numel() * logits.element_size()

    def fwd():
        return rlk.logp(logits, tokens)

    def fwd_bwd():
        return torch.autograd.grad(rlk.logp(leaf, tokens), leaf, g)

    for mode, call, nbytes in (("fwd", fwd, size), ("fwd+bwd", fwd_bwd, 3 * size)):
        for _ in range(3):
            call()
        b = bench_ms(call)
        gpu, host = queued_ms(call)
        print(f"{name} V={vocab:<6} {mode:7} bench {b:.3f} ms {100 * nbytes / 1e6 / b / copy:3.0f}%"
              f" | gpu {gpu:.3f} ms {100 * nbytes / 1e6 / gpu / copy:3.0f}% | host {host:.3f} ms")


def main() -> None:
    copy = copy_gbps()
    print(f"copy {copy:.0f} GB/s; N={N}; ms and % of copy bandwidth")
    vocabs = [int(v) for v in sys.argv[1:]] or [32768, 151936]
    with rlk.use_backends("cuda", strict=True):
        for name, dtype in DTYPES.items():
            for vocab in vocabs:
                rows(name, dtype, vocab, copy)
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
