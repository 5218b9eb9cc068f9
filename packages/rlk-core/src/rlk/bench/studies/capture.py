"""CUDA graph capture: the wall time per call eager and replayed, and which warm-ups let a
training step be captured (issue #29).

`times`: small-batch rlk.sample and rlk.logp on rlk:cuda, called eagerly and replayed from
a CUDA graph of one call, beside FlashInfer's fused sampler (the bench's peer) both ways;
per call, the median over 5 loops of 200 calls (or replays) of the loop's wall time, the
GPU drained before and after each loop, so host cost that the GPU does not hide counts.

`warmups`: each variant WARMUP:STEP in its own process (a failed capture can leave the
process unusable). WARMUP: `side` (torch's recipe: warm up on a side stream), `default`
(on the default stream), `none`. STEP: `rlk` (linear_logp -> policy_loss), `fused`
(linear_policy_loss), `torch` (the same step in plain torch). Each step ends in
loss.backward() into the leaves' .grad, as trainers do. Needs rlk-cuda and a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence

import torch

import rlk
from rlk.bench.workloads import sample as sample_workload
from rlk.testing.capture import captured, warm_up_on_a_side_stream

DEVICE = torch.device("cuda")
ROWS = 64
WARMUPS, STEPS = ("side", "default", "none"), ("rlk", "fused", "torch")
B, T, H, V = 4, 24, 64, 1000


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
    return captured(call, warmups=3)[0].replay


def _row(label: str, call: Callable[[], object]) -> str:
    try:
        eager, graph = wall_us(call), wall_us(replayed(call))
    except Exception as exc:  # a peer that cannot run or capture costs one row
        return f"| {label} | {type(exc).__name__}: {str(exc)[:80]} | |"
    return f"| {label} | {eager:.1f} | {graph:.1f} |"


def _config_rows(vocab: int, dtype: torch.dtype) -> None:
    case = sample_workload.case(ROWS, vocab, sample_workload.PLAIN)
    x = sample_workload.make_inputs(case, dtype, DEVICE, seed=0, backward=False)
    logits, seeds = x["logits"], x["seed"]
    tokens = torch.randint(0, vocab, (ROWS,), device=DEVICE)
    name = f"V={vocab} {str(dtype).replace('torch.', '')}"
    with rlk.use_backends("cuda", strict=True):
        print(_row(f"rlk.sample {name}", lambda: rlk.sample(logits, seed=seeds)))
        print(_row(f"rlk.sample top-k 50 top-p 0.9 {name}",
                   lambda: rlk.sample(logits, top_k=50, top_p=0.9, seed=seeds)))
        print(_row(f"rlk.logp {name}", lambda: rlk.logp(logits, tokens)))
    try:
        peer = sample_workload.SAMPLE.peers["flashinfer"].build(case, False, DEVICE)
    except Exception as exc:
        print(f"| FlashInfer sampling_from_logits {name} | blocked: {exc} | |")
        return
    print(_row(f"FlashInfer sampling_from_logits {name}", lambda: peer(x)))


def times() -> None:
    print("| call (B=64) | eager µs/call | replayed µs/call |")
    print("| --- | --- | --- |")
    for vocab in (128256, 256000):
        for dtype in (torch.bfloat16, torch.float32):
            _config_rows(vocab, dtype)


def _step(kind: str) -> Callable[[], None]:
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    hidden = torch.randn(B * T, H, device=DEVICE, generator=gen).bfloat16().requires_grad_()
    weight = (torch.randn(V, H, device=DEVICE, generator=gen) / 4).bfloat16().requires_grad_()
    tokens = torch.randint(0, V, (B, T), device=DEVICE, generator=gen)
    old = -torch.rand(B, T, device=DEVICE, generator=gen) * 3
    adv = torch.randn(B, device=DEVICE, generator=gen)
    mask = torch.ones(B, T, device=DEVICE)

    def step() -> None:
        if kind == "rlk":
            logp = rlk.linear_logp(hidden, weight, tokens.view(-1)).view(B, T)
            loss, _ = rlk.policy_loss(logp, old, adv, mask)
        elif kind == "fused":
            loss, _ = rlk.linear_policy_loss(hidden, weight, tokens, old, adv, mask)
        else:
            logits = (hidden @ weight.t()).float().log_softmax(-1)
            logp = logits.gather(-1, tokens.view(-1, 1)).view(B, T)
            loss = -((logp - old).exp() * adv[:, None] * mask).mean()
        loss.backward()

    return step


def capture(variant: str) -> str:
    """Warm up as `variant` says, capture one step, replay it; what happened, in a line."""
    warmup, kind = variant.split(":")
    step = _step(kind)
    try:
        if warmup == "side":
            warm_up_on_a_side_stream(step, 2)
        elif warmup == "default":
            step()
            step()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        graph.replay()
        torch.cuda.synchronize()
        return "captured and replayed"
    except Exception as exc:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/rlk" in f.filename]
        where = f" (last rlk frame: {frames[-1].filename.split('/')[-1]}:{frames[-1].lineno} " \
                f"{frames[-1].line})" if frames else ""
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"{type(exc).__name__}: {first[:160]}{where}"


def warmups() -> None:
    for warmup in WARMUPS:
        for kind in STEPS:
            variant = f"{warmup}:{kind}"
            done = subprocess.run([sys.executable, "-m", __name__, "warmups", variant],
                                  capture_output=True, text=True, timeout=120, check=False)
            lines = (done.stdout.strip() or done.stderr.strip() or "no output").splitlines()
            print(f"{variant}: {lines[-1][:300]}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="CUDA graph capture: times and warm-ups")
    parser.add_argument("study", choices=("times", "warmups"))
    parser.add_argument("variant", nargs="?", help="warmups: one WARMUP:STEP, in this process")
    options = parser.parse_args(argv)
    if options.study == "times":
        times()
    elif options.variant:
        print(capture(options.variant), flush=True)
    else:
        warmups()
    return 0


if __name__ == "__main__":  # the process of one warm-up variant
    sys.exit(main())
