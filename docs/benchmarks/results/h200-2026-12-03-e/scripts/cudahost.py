"""Host time of rlk.sample on rlk:cuda at B=64 (issue 18's small-batch rows) after the one-call
launch path: median of 5 loops of 300 calls without a sync, in µs, beside FlashInfer's own
sampler (the bench's peer) and rlk:flashinfer; then cProfile of one rlk:cuda call."""
import cProfile
import pstats
import statistics
import time

import torch

import rlk
from rlk.bench.workloads import sampling
from rlk.ops import sample as sample_op
from rlk_cuda import sample as cuda_sample

DEVICE = torch.device("cuda")


def host_us(fn, loops=5, reps=300):
    for _ in range(30):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(loops):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        out.append((time.perf_counter() - t0) / reps * 1e6)
        torch.cuda.synchronize()
    return statistics.median(out)


for v in (128256, 256000):
    for dtype in (torch.float32, torch.bfloat16):
        case = sampling.case(64, v, sampling.PLAIN)
        x = sampling.make_inputs(case, dtype, DEVICE, seed=0, backward=False)
        logits, seeds = x["logits"], x["seed"]
        peer = sampling._flashinfer(case, False, DEVICE)
        rows = {}
        with rlk.use_backends("cuda"):
            rows["rlk.sample cuda"] = host_us(lambda: rlk.sample(logits, seed=seeds))
            args, _ = sample_op._prepare(logits, 1.0, 0, 1.0, 0.0, seeds)
            rows["core _prepare"] = host_us(lambda: sample_op._prepare(logits, 1.0, 0, 1.0, 0.0, seeds))
            rows["SAMPLE.call"] = host_us(lambda: sample_op.SAMPLE.call(args))
        rows["rlk_cuda sample"] = host_us(lambda: cuda_sample.sample(logits, 1.0, 0, 1.0, 0.0, seeds))
        with rlk.use_backends("flashinfer"):
            rows["rlk.sample flashinfer"] = host_us(lambda: rlk.sample(logits, seed=seeds))
        rows["FlashInfer sampler"] = host_us(lambda: peer(x))
        print(f"V={v} {dtype}: " + "; ".join(f"{k} {us:.0f}" for k, us in rows.items()), flush=True)

with rlk.use_backends("cuda"):
    call = lambda: rlk.sample(logits, seed=seeds)
    for _ in range(30):
        call()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(500):
        call()
    pr.disable()
torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(20)
