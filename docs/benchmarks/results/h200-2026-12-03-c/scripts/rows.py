"""relative_probs and the logits GEMM at 256/512/1024 rows per float32 logits GEMM (the
chunk budget raised so blocks stay 2048 rows), one step profiled per setting, then timed."""
import os
import sys

import torch

import rlk
import rlk_cuda.linear_policy_loss as lpl

sys.argv = [sys.argv[0]]
exec(open("scratch/gpu/s7/clocks.py").read().split("def gemms")[0])  # data and step()


def profile_step():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    agg = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = e.name
            key = ("relative_probs" if "partial_kernel" in name else "finish" if "finish" in name
                   else "gemm" if "nvjet" in name or "gemm" in name.lower() else name[:60])
            agg[key] = agg.get(key, 0) + e.time_range.elapsed_us()
    return agg


with rlk.use_backends("cuda"):
    for rows, mb in ((256, 768), (512, 1024), (1024, 1536)):
        lpl._LOGITS_ROWS = rows
        os.environ["RLK_CUDA_CHUNK_MB"] = str(mb)
        for _ in range(2):
            step()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record()
        for _ in range(10):
            step()
        e.record()
        torch.cuda.synchronize()
        agg = profile_step()
        top = sorted(agg.items(), key=lambda kv: -kv[1])[:9]
        print(f"rows {rows} budget {mb} MiB: {s.elapsed_time(e)/10:.2f} ms/step; "
              + "; ".join(f"{k} {v/1e3:.2f}" for k, v in top), flush=True)
