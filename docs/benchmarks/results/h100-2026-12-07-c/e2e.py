"""TRL 1.16's GRPOTrainer train step and scoring (the `trl-grpo` workload's calls), as is
and patched at each RLK_CUDA_CHUNK_MB budget of argv[1] ("960,256"), interleaved over 5
timed rounds after a warm-up round that takes each row's peak memory above the models.

argv[2]: cases as model:T:B, comma-separated (models of rlk.bench.workloads.trl_grpo).
"""

import json
import os
import sys
import tempfile
from pathlib import Path

import torch

from rlk.bench.workloads import trl_grpo as workload
from rlk.integrations import trl as rlk_trl

budgets = sys.argv[1].split(",")
cases = [(model, int(length), int(batch))
         for model, length, batch in (case.split(":") for case in sys.argv[2].split(","))]
device = torch.device("cuda")
work = Path(tempfile.mkdtemp())
rows = [("trl", None)] + [(f"rlk@{budget}", budget) for budget in budgets]
calls = (("step", workload.train_step), ("score", workload.score))


def timed(call, trainer, batch):
    start, stop = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    start.record()
    call(trainer, batch)
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop)


def peak(call, trainer, batch):
    call(trainer, batch)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    call(trainer, batch)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**30


for model, length, size in cases:
    if not (work / model).exists():
        workload.save_model(model, work / model)
    trainer = workload.trainer(work / model, work / "out", length, size, device)
    batch = workload.scored_batch(trainer, 0)
    times = {(row, mode): [] for row, _ in rows for mode, _ in calls}
    peaks = {}
    for round_ in range(6):
        for row, budget in rows:
            if budget is None:
                rlk_trl.unpatch()
            else:
                rlk_trl.patch()
                os.environ["RLK_CUDA_CHUNK_MB"] = budget
            for mode, call in calls:
                if round_ == 0:
                    peaks[row, mode] = peak(call, trainer, batch)
                else:
                    times[row, mode].append(timed(call, trainer, batch))
    for (row, mode), found in times.items():
        found.sort()
        print(json.dumps(dict(case=f"{model} T={length} B={size}", row=row, mode=mode,
                              ms=round(found[len(found) // 2], 2), min_ms=round(found[0], 2),
                              peak_gib=round(peaks[row, mode], 3))), flush=True)
    rlk_trl.unpatch()
    trainer = batch = None
    torch.cuda.empty_cache()
