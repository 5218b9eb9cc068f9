"""Settings of linear_policy_loss's one-read path timed in turns (ABCABC...), so that clock
and power drift falls on every setting alike. `python abab.py rows`: rows per float32 logits
GEMM and the chunk budget; `python abab.py nseg`: relative_probs blocks per row."""
import os
import sys

import torch

import rlk
import rlk_cuda.linear_policy_loss as lpl
from rlk_cuda import _ext

mode = sys.argv[1]
sys.argv = [sys.argv[0]]
exec(open("scratch/gpu/s7/clocks.py").read().split("def gemms")[0])  # data and step()
ext = _ext.load()
default_segments = ext.relative_probs_segments


def apply(setting):
    if mode == "rows":
        lpl._LOGITS_ROWS, mb = setting
        os.environ["RLK_CUDA_CHUNK_MB"] = str(mb)
    else:
        ext.relative_probs_segments = (default_segments if setting is None
                                       else (lambda V, n=setting: n))


SETTINGS = [(256, 768), (512, 768)] if mode == "rows" else [None, 8, 4, 32]
times = {c: [] for c in SETTINGS}
with rlk.use_backends("cuda"):
    for rnd in range(3):
        for setting in SETTINGS:
            apply(setting)
            step()
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(True), torch.cuda.Event(True)
            s.record()
            for _ in range(6):
                step()
            e.record()
            torch.cuda.synchronize()
            times[setting].append(s.elapsed_time(e) / 6)
    for setting, t in times.items():
        apply(setting)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        rp = sum(ev.time_range.elapsed_us() for ev in prof.events()
                 if ev.device_type == torch.autograd.DeviceType.CUDA
                 and ("partial_kernel" in ev.name or "finish_kernel" in ev.name))
        print(f"{mode} {setting}: {[round(v, 2) for v in t]} ms/step, median "
              f"{sorted(t)[len(t)//2]:.2f}; relative_probs {rp / 1e3:.2f} ms/step", flush=True)
