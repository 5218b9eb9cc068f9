"""Host time of rlk.sample on rlk:cuda at B=64 V=128256 (issue 18's remaining finding), piece by
piece: median of 5 loops of 300 calls without a sync, in µs; then cProfile of the whole call."""
import cProfile
import pstats
import statistics
import time

import torch

import rlk
from rlk.ops import sample as sample_op
from rlk_cuda import _ext
from rlk_cuda import sample as cuda_sample
from rlk_cuda.logp import launch_forward
from rlk_cuda._launch import f32_empty

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


for dtype in (torch.bfloat16, torch.float32):
    logits = torch.randn(64, 128256, device=DEVICE, dtype=dtype) * 3
    seeds = torch.randint(0, 2**62, (64,), device=DEVICE)
    stats = f32_empty(2, 64, device=DEVICE)
    rows = {}
    with rlk.use_backends("cuda"):
        rows["rlk.sample"] = host_us(lambda: rlk.sample(logits, temperature=1.0, seed=seeds))
        rows["core _prepare"] = host_us(lambda: sample_op._prepare(logits, 1.0, 0, 1.0, 0.0, seeds))
        args, _ = sample_op._prepare(logits, 1.0, 0, 1.0, 0.0, seeds)
        rows["SAMPLE.kernel(args)"] = host_us(lambda: sample_op.SAMPLE.kernel(args))
        rows["SAMPLE.call"] = host_us(lambda: sample_op.SAMPLE.call(args))
    rows["rlk_cuda sample"] = host_us(lambda: cuda_sample.sample(logits, 1.0, 0, 1.0, 0.0, seeds))
    rows["launch_forward (stats)"] = host_us(
        lambda: launch_forward(logits, None, 1.0, -100, None, None, None, None, stats))
    rows["4 x torch.empty"] = host_us(lambda: [torch.empty(64, device=DEVICE) for _ in range(4)])
    ext = _ext.load()
    rows["ext.logp_forward_segments"] = host_us(lambda: ext.logp_forward_segments(128256))
    print(f"{dtype}: " + "; ".join(f"{k} {v:.0f}" for k, v in rows.items()), flush=True)

with rlk.use_backends("cuda"):
    call = lambda: rlk.sample(logits, temperature=1.0, seed=seeds)
    for _ in range(30):
        call()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(500):
        call()
    pr.disable()
torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(25)
