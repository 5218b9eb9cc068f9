"""Host-time profiles: rlk.logp fwd+bwd at V=32768, rlk.sample on flashinfer and cuda at B=64."""
import cProfile
import pstats
import sys
import time

import torch

import rlk

dev = torch.device("cuda")
which = sys.argv[1]


def host_wall(fn, reps=200):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    host = (time.perf_counter() - t0) / reps * 1e3
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / reps * 1e3
    return host, wall


def profile(name, fn, reps=300):
    h, w = host_wall(fn)
    print(f"## {name}: host {h:.3f} ms wall {w:.3f} ms", flush=True)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(reps):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    st = pstats.Stats(pr)
    st.sort_stats("tottime").print_stats(28)
    st.sort_stats("cumulative").print_stats(40)


if which == "logp":
    for dt in (torch.bfloat16, torch.float16):
        logits = (torch.randn(8192, 32768, device=dev) * 3).to(dt).requires_grad_()
        tokens = torch.randint(0, 32768, (8192,), device=dev)
        g = torch.randn(8192, device=dev)
        with rlk.use_backends("cuda"):
            def fb():
                lp = rlk.logp(logits, tokens)
                torch.autograd.grad(lp, logits, g)
            def fw():
                with torch.no_grad():
                    rlk.logp(logits, tokens)
            profile(f"logp fwd+bwd {dt}", fb)
            h, w = host_wall(fw)
            print(f"## logp fwd {dt}: host {h:.3f} wall {w:.3f}")

if which == "sample":
    for backend in ("flashinfer", "cuda"):
        for b, v, kw in ((64, 128256, {}), (64, 128256, dict(top_k=50, top_p=0.9)),
                         (256, 128256, dict(top_k=50, top_p=0.9))):
            logits = (torch.randn(b, v, device=dev) * 3).to(torch.bfloat16)
            seeds = torch.randint(0, 2**62, (b,), device=dev)
            with rlk.use_backends(backend):
                fn = lambda: rlk.sample(logits, temperature=0.8, seed=seeds, **kw)
                if b == 64 and not kw:
                    profile(f"sample {backend} B={b} {kw}", fn)
                else:
                    h, w = host_wall(fn)
                    print(f"## sample {backend} B={b} {kw}: host {h:.3f} wall {w:.3f}")
    import flashinfer.sampling as fi
    logits = (torch.randn(64, 128256, device=dev) * 3).to(torch.bfloat16)
    h, w = host_wall(lambda: fi.sampling_from_logits(logits))
    print(f"## flashinfer sampling_from_logits B=64: host {h:.3f} wall {w:.3f}")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        with rlk.use_backends("flashinfer"):
            for _ in range(20):
                rlk.sample(logits, temperature=0.8, seed=torch.randint(0, 2**62, (64,), device=dev))
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=30, max_name_column_width=60)[:7000])
