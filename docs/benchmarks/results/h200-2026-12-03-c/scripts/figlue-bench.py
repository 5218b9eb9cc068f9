"""figlue (issue 18): rlk.sample on backend flashinfer against FlashInfer's own sampler (the
bench's peer, tokens only): CUDA-event ms per call over a loop, host ms per call (issue time
of the loop), per-row seeds made outside the loop, T = 0.8; then one call's launches."""
import sys
import time
from collections import Counter

import torch

import rlk
from rlk import reference
from rlk.bench.workloads import sampling

DEVICE = torch.device("cuda")
T = 0.8
FILTERS = {"none": sampling.PLAIN, "k50p.9": sampling.TOP_K_TOP_P,
           "p.95m.05": sampling.TOP_P_MIN_P}
ITERS = 20


def timed(call, x):
    for _ in range(3):
        call(x)
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    began = time.perf_counter()
    for _ in range(ITERS):
        call(x)
    host = (time.perf_counter() - began) * 1e3 / ITERS
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / ITERS, host


def ours(filters):
    def call(x):
        return rlk.sample(x["logits"], temperature=T, seed=x["seed"], **filters)
    return call


def check(x, filters, out):
    tokens, logp, processed = out
    log_q = reference.sample_log_probs(x["logits"][:4].cpu(), temperature=T, **filters)
    chosen = log_q.gather(1, tokens[:4].cpu()[:, None])[:, 0]
    same = torch.equal(logp, rlk.logp(x["logits"], tokens, temperature=T))
    err = float((processed[:4].cpu().double() - chosen).abs().max())
    return "ok" if bool(chosen.isfinite().all()) and same and err < 1e-4 else f"BAD({err:.0e})"


def table():
    print(f"{'B':>5} {'V':>6} {'filter':>8} {'dtype':>5} | {'rlk ms':>7} {'fi ms':>7} "
          f"{'ratio':>5} | {'host':>6} {'fi hst':>6} | check")
    worst, hits, total = {}, 0, 0
    for v in (128256, 256000):
        for name, filters in FILTERS.items():
            for dtype in (torch.bfloat16, torch.float32):
                for b in (64, 256, 1024):
                    if dtype == torch.float32 and b != 64:
                        continue
                    case = sampling.case(b, v, filters)
                    x = sampling.make_inputs(case, dtype, DEVICE, seed=0, backward=False)
                    peer = sampling._flashinfer(case, False, DEVICE)
                    with rlk.use_backends("flashinfer"):
                        note = check(x, filters, ours(filters)(x))
                        r_dev, r_host = timed(ours(filters), x)
                    f_dev, f_host = timed(peer, x)
                    ratio = r_dev / f_dev
                    worst[b] = max(worst.get(b, 0.0), ratio)
                    hits, total = hits + (ratio <= 1.25), total + 1
                    print(f"{b:>5} {v:>6} {name:>8} {str(dtype)[6:10]:>5} | {r_dev:7.3f} "
                          f"{f_dev:7.3f} {ratio:5.2f} | {r_host:6.3f} {f_host:6.3f} | {note}")
                    del x
    print("worst ratio by B: " + ", ".join(f"B={b}: {r:.2f}" for b, r in sorted(worst.items()))
          + f"; {hits}/{total} within 1.25")


def launches():
    from torch.profiler import ProfilerActivity, profile
    for name, filters in FILTERS.items():
        for temperature in ((T, 0.0) if name == "none" else (T,)):
            case = sampling.case(64, 128256, filters)
            x = sampling.make_inputs(case, torch.bfloat16, DEVICE, seed=0, backward=False)

            def call():
                with rlk.use_backends("flashinfer"):
                    return rlk.sample(x["logits"], temperature=temperature, seed=x["seed"],
                                      **filters)
            call()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                call()
                torch.cuda.synchronize()
            events = prof.events()
            kernels = [e.name.split("(")[0].split("<")[0][-24:] for e in events
                       if e.device_type.name == "CUDA"]
            aten = Counter(e.name[6:] for e in events
                           if e.device_type.name == "CPU" and e.name.startswith("aten::"))
            print(f"B=64 bf16 {name} T={temperature}: {len(kernels)} kernels "
                  f"[{', '.join(kernels)}]"[:230])
            print(f"   aten ops: {dict(aten)}"[:230])


if __name__ == "__main__":
    launches() if sys.argv[1:] == ["launches"] else table()
