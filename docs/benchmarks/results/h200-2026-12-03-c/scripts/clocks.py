"""linear_policy_loss back to back vs the same three cuBLAS GEMMs back to back, with the SM
clock and power sampled by nvidia-smi during each loop."""
import subprocess
import sys
import time

import torch

import rlk

dev = "cuda"
B, T, H, V = 16, 1024, 4096, 128256
N = B * T
dt = torch.bfloat16
g = torch.Generator(device=dev).manual_seed(0)
hidden = torch.randn(B, T, H, generator=g, device=dev, dtype=dt)
weight = torch.randn(V, H, generator=g, device=dev, dtype=dt).mul_(2.0 / H**0.5)
tokens = torch.randint(0, V, (B, T), generator=g, device=dev)
typical = -torch.log(torch.tensor(float(V))) + torch.randn(B, T, generator=g, device=dev) * 1.5
ref = typical + torch.randn(B, T, generator=g, device=dev) * 0.3
adv = torch.randn(B, generator=g, device=dev)
lengths = torch.randint(T // 2, T + 1, (B, 1), generator=g, device=dev)
mask = (torch.arange(T, device=dev) < lengths).float()
opts = dict(clip_low=0.2, clip_high=0.28, kl_coef=0.04, kl_estimator="k3", agg="token-mean")
h = hidden.detach().requires_grad_()
w = weight.detach().requires_grad_()


def step():
    loss, _ = rlk.linear_policy_loss(h, w, tokens, typical, adv, mask, ref_logp=ref, **opts)
    torch.autograd.grad(loss, (h, w))


x = hidden.view(N, H)
G = torch.randn(N, V, device=dev, dtype=dt)
gh = torch.empty(N, H, device=dev, dtype=dt)
gw = torch.empty(V, H, device=dev, dtype=dt)
lg = torch.empty(N, V, device=dev, dtype=dt)


def gemms():
    torch.mm(x, weight.t(), out=lg)
    torch.mm(G, weight, out=gh)
    torch.mm(G.t(), x, out=gw)


def timed(name, fn, reps, sample=True):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    smi = None
    if sample:
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active",
                                "--format=csv,noheader", "-lms", "50"], stdout=subprocess.PIPE, text=True)
        time.sleep(0.3)
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    s.record()
    for _ in range(reps):
        fn()
    e.record()
    torch.cuda.synchronize()
    ms = s.elapsed_time(e) / reps
    samples = []
    if smi:
        smi.terminate()
        samples = [l for l in smi.stdout.read().splitlines() if l.strip()]
    print(f"{name}: {ms:.2f} ms/iter over {reps}", flush=True)
    if samples:
        clocks = [int(l.split(",")[0].split()[0]) for l in samples]
        power = [float(l.split(",")[2].split()[0]) for l in samples]
        print(f"   sm clock MHz min {min(clocks)} median {sorted(clocks)[len(clocks)//2]} max {max(clocks)}; "
              f"power W median {sorted(power)[len(power)//2]:.0f} max {max(power):.0f}; n={len(samples)}")
        print("   first/last:", samples[1] if len(samples) > 1 else "", "|", samples[-1])
    return ms


def isolated(name, fn, n=5):
    out = []
    for _ in range(n):
        torch.cuda.synchronize()
        time.sleep(0.2)
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        out.append(s.elapsed_time(e))
    print(f"{name} isolated (0.2 s idle before each): {[round(v, 2) for v in out]}", flush=True)


with rlk.use_backends("cuda"):
    isolated("three GEMMs", gemms)
    isolated("linear_policy_loss", step)
    timed("three GEMMs x5", gemms, 5)
    timed("linear_policy_loss x5", step, 5)
    timed("three GEMMs x40", gemms, 40)
    timed("linear_policy_loss x40", step, 40)
    timed("three GEMMs x40 again", gemms, 40)
    for name, f in (("logits", lambda: torch.mm(x, weight.t(), out=lg)),
                    ("logits f32", lambda: torch.mm(x, weight.t(), out_dtype=torch.float32)),
                    ("grad_h", lambda: torch.mm(G, weight, out=gh)),
                    ("grad_w", lambda: torch.mm(G.t(), x, out=gw))):
        timed(f"  {name} x20", f, 20, sample=False)
    if len(sys.argv) > 1:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        evs = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
        busy = sum(e.time_range.elapsed_us() for e in evs)
        span = evs[-1].time_range.end - evs[0].time_range.start
        print(f"3 steps under the profiler: span {span/1e3:.2f} ms busy {busy/1e3:.2f} ms")
        gaps = sorted(((evs[i+1].time_range.start - evs[i].time_range.end, evs[i].name[:50], evs[i+1].name[:50])
                       for i in range(len(evs) - 1)), reverse=True)[:8]
        for gap in gaps:
            print("   gap us", gap)
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=60)[:3000])
