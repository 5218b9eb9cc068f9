"""Where the flashinfer backend's `sample` spends its time, stage by stage: the calls of
rlk_flashinfer.bench, each timed by rlk.bench.studies.host (host time without a sync, wall
time drained).

    python benchmarks/flashinfer/sample_stages.py     (needs FlashInfer and a CUDA device)
"""

import torch

from rlk.bench.studies import host
from rlk_flashinfer.bench import sample_stages

if __name__ == "__main__":
    for name, call in sample_stages():
        print(host.line(name, call, 20, torch.device("cuda"), width=58))
