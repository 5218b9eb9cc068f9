"""rlk.sample on backend flashinfer against FlashInfer's own sampler (the bench's peer):
per-call time by CUDA events and by host clock, per-row seeds, logits std 3."""
import sys
import time

import torch

import rlk
from rlk import reference
from rlk.bench.workloads import sampling

DEVICE = torch.device("cuda")
FILTERS = {"none": sampling.PLAIN, "k50p.9": sampling.TOP_K_TOP_P, "p.95m.05": sampling.TOP_P_MIN_P}


def timed(call, x, iters):
    for _ in range(3):
        call(x)
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    began = time.perf_counter()
    start.record()
    for _ in range(iters):
        call(x)
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / iters, (time.perf_counter() - began) * 1e3 / iters


def rlk_call(filters):
    def call(x):
        with rlk.use_backends("flashinfer", strict=True):
            return rlk.sample(x["logits"], seed=x["seed"], temperature=1.0, **filters)
    return call


def check(x, filters, out):
    """Rows 0-3: token in the float64 kept set, logp == rlk.logp, processed vs float64."""
    tokens, logp, processed = out
    rows = x["logits"][:4]
    log_q = reference.sample_log_probs(rows.cpu(), temperature=1.0, **filters)
    chosen = log_q.gather(1, tokens[:4].cpu()[:, None])[:, 0]
    same = torch.equal(logp, rlk.logp(x["logits"], tokens, temperature=1.0))
    return bool(chosen.isfinite().all()) and same, float((processed[:4].cpu().double() - chosen).abs().max())


def main():
    worst = 0.0
    print(f"{'B':>5} {'V':>6} {'filter':>9} | {'bf16 rlk':>8} {'fi':>6} {'ratio':>5} {'host':>5} |"
          f" {'fp32 rlk':>8} {'fi':>6} {'ratio':>5} {'host':>5} | check")
    for name, filters in FILTERS.items():
        for v in (128256, 256000):
            for b in (64, 256, 1024):
                line = f"{b:>5} {v:>6} {name:>9} |"
                notes = []
                for dtype in (torch.bfloat16, torch.float32):
                    case = sampling.case(b, v, filters)
                    x = sampling.make_inputs(case, dtype, DEVICE, seed=0, backward=False)
                    peer = sampling._flashinfer(case, False, DEVICE)
                    ours = rlk_call(filters)
                    ok, err = check(x, filters, ours(x))
                    notes.append(f"{'ok' if ok else 'BAD'} {err:.0e}")
                    iters = 20 if b * v < 1e8 else 8
                    r_dev, r_host = timed(ours, x, iters)
                    f_dev, f_host = timed(peer, x, iters)
                    ratio = r_dev / f_dev
                    worst = max(worst, ratio)
                    line += f" {r_dev:8.3f} {f_dev:6.3f} {ratio:5.2f} {r_host / f_host:5.2f} |"
                    del x
                print(line, " ".join(notes))
    print(f"worst ratio (CUDA events, rlk/flashinfer): {worst:.2f} (target <= 1.25)")


def profile():
    from torch.profiler import ProfilerActivity, profile as run
    for name, filters in FILTERS.items():
        case = sampling.case(64, 128256, filters)
        x = sampling.make_inputs(case, torch.bfloat16, DEVICE, seed=0, backward=False)
        call = rlk_call(filters)
        call(x)
        torch.cuda.synchronize()
        with run(activities=[ProfilerActivity.CUDA]) as prof:
            call(x)
            torch.cuda.synchronize()
        kernels = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
        short = ", ".join(k.split("(")[0].split("<")[0][-28:] for k in kernels)
        print(f"B=64 bf16 {name}: {len(kernels)} device ops: {short}"[:400])


if __name__ == "__main__":
    profile() if sys.argv[1:] == ["profile"] else main()
