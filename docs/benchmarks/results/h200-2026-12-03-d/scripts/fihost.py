"""Host time of each piece of an rlk:flashinfer sample call (issue 18), B=64, T=0.8: the whole
rlk.sample, the backend's sample, and each launch alone, as the median of 5 loops of 200
calls without a sync; then cProfile of rlk.sample. FlashInfer's own sampler for reference."""
import cProfile
import pstats
import statistics
import time

import torch

import rlk
from rlk.bench.workloads import sampling
from rlk_flashinfer import kernel, sampler, shortlist

DEVICE = torch.device("cuda")
T = 0.8


def host_us(fn, loops=5, reps=200):
    for _ in range(20):
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


FILTERS = {"none": sampling.PLAIN, "k50p.9": sampling.TOP_K_TOP_P,
           "p.95m.05": sampling.TOP_P_MIN_P}
for v in (128256, 256000):
    for name, f in FILTERS.items():
        case = sampling.case(64, v, f)
        x = sampling.make_inputs(case, torch.bfloat16, DEVICE, seed=0, backward=False)
        logits, seeds = x["logits"], x["seed"]
        k, p, m = f.get("top_k", 0), f.get("top_p", 1.0), f.get("min_p", 0.0)
        peer = sampling._flashinfer(case, False, DEVICE)
        rows = {}
        with rlk.use_backends("flashinfer"):
            rows["rlk.sample"] = host_us(lambda: rlk.sample(logits, temperature=T, seed=seeds, **f))
            rows["backend sample"] = host_us(lambda: sampler.sample(logits, T, k, p, m, seeds))
            rows["check_arguments"] = host_us(lambda: sampler.check_arguments(logits, T, k, p, m, seeds))
            rows["statistics"] = host_us(lambda: kernel.statistics(logits, T))
            stats = kernel.statistics(logits, T)
            size = shortlist.size(v, k, p, m)
            lists = sampler._shortlists(logits, size) if size is not None else None
            if size is not None:
                rows[f"flashinfer top_k ({size})"] = host_us(lambda: sampler._shortlists(logits, size))
            tokens = torch.empty(64, dtype=torch.int64, device=DEVICE)
            proc = torch.empty(64, dtype=torch.float32, device=DEVICE)
            rows["sample_rows"] = host_us(lambda: kernel.sample(logits, seeds, stats, lists, T, k, p, m, tokens, proc))
            rows["_logp"] = host_us(lambda: sampler._logp(logits, tokens, T))
        with rlk.use_backends("cuda"):
            rows["rlk.logp (cuda)"] = host_us(lambda: rlk.logp(logits, tokens, temperature=T))
        rows["torch.empty"] = host_us(lambda: torch.empty(64, dtype=torch.float32, device=DEVICE))
        rows["FlashInfer sampler"] = host_us(lambda: peer(x))
        print(f"V={v} {name}: " + "; ".join(f"{k_} {us:.0f}" for k_, us in rows.items()), flush=True)

case = sampling.case(64, 128256, sampling.TOP_P_MIN_P)
x = sampling.make_inputs(case, torch.bfloat16, DEVICE, seed=0, backward=False)
with rlk.use_backends("flashinfer"):
    call = lambda: rlk.sample(x["logits"], temperature=T, seed=x["seed"], **sampling.TOP_P_MIN_P)
    for _ in range(20):
        call()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(300):
        call()
    pr.disable()
torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(22)
