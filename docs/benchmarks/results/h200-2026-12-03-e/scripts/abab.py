"""Small-batch sample rows in turns (issue 18): the bench's per-call CUDA events
(rlk.bench.timing.time_calls), 12 rounds of 40 calls of rlk:cuda, rlk:flashinfer and
FlashInfer's own sampler (the bench's peer) taken in turn, so that the host's slow and fast
phases fall on all three alike. Prints each one's median over the rounds' medians, in ms, and
the ratios to FlashInfer's."""
import statistics

import torch

import rlk
from rlk.bench.timing import time_calls
from rlk.bench.workloads import sampling

DEVICE = torch.device("cuda")
ROUNDS, CALLS = 12, 40


def timed(name, call):
    """The median ms of CALLS calls; rlk's under its backend (the scope entered once)."""
    if name.startswith("rlk:"):
        with rlk.use_backends(name[4:]):
            return statistics.median(time_calls(call, CALLS, DEVICE))
    return statistics.median(time_calls(call, CALLS, DEVICE))


for filters, label in ((sampling.PLAIN, "no filter"), (sampling.TOP_K_TOP_P, "top_k=50 top_p=0.9")):
    for b in (64, 256):
        for v in (128256, 256000):
            for dtype in (torch.bfloat16, torch.float32, torch.float16):
                case = sampling.case(b, v, filters)
                x = sampling.make_inputs(case, dtype, DEVICE, seed=0, backward=False)
                peer = sampling._flashinfer(case, False, DEVICE)
                ours = lambda _: rlk.sample(x["logits"], seed=x["seed"], **filters)  # noqa: E731
                calls = {"rlk:cuda": ours, "rlk:flashinfer": ours, "flashinfer": lambda _: peer(x)}
                medians = {name: [] for name in calls}
                for name, call in calls.items():  # warm-up
                    timed(name, call)
                for _ in range(ROUNDS):
                    for name, call in calls.items():
                        medians[name].append(timed(name, call))
                ms = {name: statistics.median(m) for name, m in medians.items()}
                fi = ms["flashinfer"]
                print(f"B={b} V={v} {label} {str(dtype)[6:]}: "
                      + "; ".join(f"{n} {t:.4f}" for n, t in ms.items())
                      + f"; cuda/fi {ms['rlk:cuda'] / fi:.2f}; flashinfer/fi {ms['rlk:flashinfer'] / fi:.2f}",
                      flush=True)
