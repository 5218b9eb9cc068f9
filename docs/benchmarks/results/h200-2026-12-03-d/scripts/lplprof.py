"""linear_policy_loss (GRPO k3, bf16, H=4096) at B=16 V=128256 and B=8 V=151936: ms per step
over 10 steps, then one profiled step's CUDA time by kernel, beside the three cuBLAS GEMMs."""
import torch

import rlk

dev = "cuda"
T, H = 1024, 4096
dt = torch.bfloat16
opts = dict(clip_low=0.2, clip_high=0.28, kl_coef=0.04, kl_estimator="k3", agg="token-mean")


def timed(fn, reps=10):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    s.record()
    for _ in range(reps):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / reps


def kernels(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    agg = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            name = ev.name
            key = "gemm" if "nvjet" in name or "gemm" in name.lower() else name[:70]
            n, t = agg.get(key, (0, 0.0))
            agg[key] = (n + 1, t + ev.time_range.elapsed_us())
    return sorted(agg.items(), key=lambda kv: -kv[1][1])


for B, V in ((16, 128256), (8, 151936)):
    N = B * T
    g = torch.Generator(device=dev).manual_seed(0)
    hidden = torch.randn(B, T, H, generator=g, device=dev, dtype=dt)
    weight = torch.randn(V, H, generator=g, device=dev, dtype=dt).mul_(2.0 / H**0.5)
    tokens = torch.randint(0, V, (B, T), generator=g, device=dev)
    typical = -torch.log(torch.tensor(float(V))) + torch.randn(B, T, generator=g, device=dev) * 1.5
    ref = typical + torch.randn(B, T, generator=g, device=dev) * 0.3
    adv = torch.randn(B, generator=g, device=dev)
    lengths = torch.randint(T // 2, T + 1, (B, 1), generator=g, device=dev)
    mask = (torch.arange(T, device=dev) < lengths).float()
    h = hidden.detach().requires_grad_()
    w = weight.detach().requires_grad_()

    def step():
        loss, _ = rlk.linear_policy_loss(h, w, tokens, typical, adv, mask, ref_logp=ref, **opts)
        torch.autograd.grad(loss, (h, w))

    x = hidden.view(N, H)
    G = torch.randn(N, V, device=dev, dtype=dt)
    gh, gw = torch.empty(N, H, device=dev, dtype=dt), torch.empty(V, H, device=dev, dtype=dt)
    lg = torch.empty(N, V, device=dev, dtype=dt)

    def gemms():
        torch.mm(x, weight.t(), out=lg)
        torch.mm(G, weight, out=gh)
        torch.mm(G.t(), x, out=gw)

    with rlk.use_backends("cuda"):
        for turn in range(2):
            op, floor = timed(step), timed(gemms)
            print(f"B={B} V={V} turn {turn}: op {op:.2f} ms, three GEMMs {floor:.2f} ms, "
                  f"ratio {op / floor:.3f}", flush=True)
        for key, (n, us) in kernels(step)[:12]:
            print(f"   {us / 1e3:7.3f} ms  x{n:<4} {key}")
        for key, (n, us) in kernels(gemms)[:3]:
            print(f"   floor {us / 1e3:7.3f} ms  x{n:<4} {key}")
    del G, lg, gh, gw, hidden, weight, h, w
    torch.cuda.empty_cache()
