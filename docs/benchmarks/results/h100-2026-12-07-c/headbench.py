"""The LM head alone, as TRL's GRPO step runs it: TRL's ChunkedLogProbFunction against
rlk.linear_logp_entropy at the RLK_CUDA_CHUNK_MB budgets given as arguments, bf16 autocast
over a float32 weight, V=151936; median ms of 7 and peak MiB above the inputs.

Environment: SKIP_TRL=1 leaves TRL's rows out, BLOCK_ROWS sets rlk-cuda's row block,
SHAPES=k keeps the first k shapes.
"""

import json
import os
import sys

import torch
from trl.kernels.chunked_logprob import ChunkedLogProbFunction

import rlk
import rlk_cuda.linear_logp as linear

VOCAB = 151936
SHAPES = [(16384, 896), (12288, 1536), (4096, 896)]
device = torch.device("cuda")
if os.environ.get("BLOCK_ROWS"):
    linear._BLOCK_ROWS = int(os.environ["BLOCK_ROWS"])


def trl_head(hidden, weight, tokens):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logp, _entropy, *_ = ChunkedLogProbFunction.apply(
            hidden, weight, None, tokens, 1.0, 32768, None, 1.0, ("log_probs", "entropy"))
    return logp


def rlk_head(hidden, weight, tokens):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logp, _entropy = rlk.linear_logp_entropy(hidden, weight, tokens)
    return logp


def measure(name, head, num, width, backward, reps=7):
    gen = torch.Generator(device=device).manual_seed(0)
    weight = (torch.randn(VOCAB, width, device=device, generator=gen) * 0.02)
    weight.requires_grad_(backward)
    hidden = torch.randn(num, width, device=device, generator=gen).requires_grad_(backward)
    tokens = torch.randint(0, VOCAB, (num,), device=device, generator=gen)
    upstream = torch.randn(num, device=device, generator=gen)

    def once():
        if backward:
            torch.autograd.backward(head(hidden, weight, tokens), upstream)
            hidden.grad = weight.grad = None
        else:
            with torch.no_grad():
                head(hidden, weight, tokens)

    once()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    once()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    times = []
    for _ in range(reps):
        start, stop = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        once()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    print(json.dumps(dict(name=name, N=num, H=width, mode="fwd+bwd" if backward else "fwd",
                          ms=times[len(times) // 2], min_ms=times[0],
                          peak_mib=round(peak, 1))), flush=True)


for num, width in SHAPES[: int(os.environ.get("SHAPES", len(SHAPES)))]:
    for backward in (False, True):
        if not os.environ.get("SKIP_TRL"):
            measure("trl", trl_head, num, width, backward)
        for budget in sys.argv[1:]:
            os.environ["RLK_CUDA_CHUNK_MB"] = budget
            measure(f"rlk@{budget}/rows{linear._BLOCK_ROWS}", rlk_head, num, width, backward)
