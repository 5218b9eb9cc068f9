"""Diagnostics for linear_policy_loss on the H200: where the time goes, chunk GEMM costs,
and the logp/loss error with exact (float64) token logits."""
import os
import sys
import time

import torch

import rlk

dev = "cuda"
torch.manual_seed(0)
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


def ev_time(fn, reps=5, warm=2):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    s.record()
    for _ in range(reps):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / reps


section = sys.argv[1] if len(sys.argv) > 1 else "all"

h = hidden.detach().requires_grad_()
w = weight.detach().requires_grad_()


def step(coef=0.0):
    loss, _ = rlk.linear_policy_loss(h, w, tokens, typical, adv, mask, ref_logp=ref,
                                     entropy_coef=coef, **opts)
    torch.autograd.grad(loss, (h, w))


if section in ("all", "time"):
    with rlk.use_backends("cuda"):
        print("plan:", rlk.explain("linear_policy_loss", h, w, tokens, typical, adv, mask, ref_logp=ref, **opts).plan)


        ms = ev_time(step)
        ms2 = ev_time(lambda: step(1e-12))
        print(f"linear_policy_loss fwd+bwd one read {ms:.2f} ms; two reads {ms2:.2f} ms", flush=True)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA,
                                                torch.profiler.ProfilerActivity.CPU]) as prof:
            step()
            torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=18,
                                          max_name_column_width=70)
        print(table[:6000])
        # gaps on the device: total span vs busy time
        evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        evs.sort(key=lambda e: e.time_range.start)
        busy = sum(e.time_range.elapsed_us() for e in evs)
        span = evs[-1].time_range.end - evs[0].time_range.start
        print(f"device span {span/1e3:.2f} ms busy(sum) {busy/1e3:.2f} ms kernels {len(evs)}")

if section in ("all", "gemm"):
    x = hidden.view(N, H)
    wt = weight
    print("full GEMM bf16 out N=16384:", f"{ev_time(lambda: torch.mm(x, wt.t())):.2f} ms")
    for rows in (256, 1024, 2048):
        xs = x[:rows]
        out32 = torch.empty(rows, V, device=dev)
        gch = torch.randn(rows, V, device=dev, dtype=dt)
        acc = torch.zeros_like(wt)
        k = N // rows
        t1 = ev_time(lambda: torch.mm(xs, wt.t(), out_dtype=torch.float32, out=out32))
        t1b = ev_time(lambda: torch.mm(xs, wt.t()))
        outh = torch.empty(rows, H, device=dev, dtype=dt)
        t2 = ev_time(lambda: torch.mm(gch, wt, out=outh))
        t3 = ev_time(lambda: acc.addmm_(gch.t(), xs))
        gw = torch.empty_like(wt)
        t3b = ev_time(lambda: torch.mm(gch.t(), xs, out=gw))
        print(f"rows {rows}: x{k} logits f32 {t1*k:.2f} (bf16 out {t1b*k:.2f}) grad_h {t2*k:.2f} "
              f"grad_w addmm_ {t3*k:.2f} (beta=0 {t3b*k:.2f}) sum {(t1+t2+t3)*k:.2f} ms", flush=True)
        del out32, gch, acc, gw

if section in ("all", "precision"):
    from rlk import reference
    from rlk.ops.policy_loss_options import PolicyLossOptions
    x = hidden.view(N, H)
    tk = tokens.view(-1)
    with rlk.use_backends("cuda"):
        logp = rlk.linear_logp(x, weight, tk)
        loss, metrics = rlk.linear_policy_loss(hidden, weight, tokens, typical, adv, mask,
                                               ref_logp=ref, **opts)
    lse64 = torch.empty(N, dtype=torch.float64, device=dev)
    tok64 = torch.empty(N, dtype=torch.float64, device=dev)
    lse32 = torch.empty(N, dtype=torch.float64, device=dev)
    for i in range(0, N, 1024):
        lg = x[i:i + 1024].double() @ weight.double().t()
        lse64[i:i + 1024] = lg.logsumexp(-1)
        tok64[i:i + 1024] = lg.gather(1, tk[i:i + 1024, None])[:, 0]
        lg32 = torch.mm(x[i:i + 1024], weight.t(), out_dtype=torch.float32).double()
        lse32[i:i + 1024] = lg32.logsumexp(-1)
    exact = tok64 - lse64
    fixed = (tok64 - lse32)
    rowdot = (x.double() * weight[tk].double()).sum(-1)
    print("token logit: |rowdot - float64 GEMM| max", (rowdot - tok64).abs().max().item())
    print("logp err: rlk", (logp.double() - exact).abs().max().item(),
          "mean", (logp.double() - exact).mean().item(),
          "| exact token logit + lse of f32 GEMM", (fixed - exact).abs().max().item(),
          "mean", (fixed - exact).mean().item())
    o = PolicyLossOptions(**opts)

    def loss_of(lp):
        return reference.policy_loss(lp.view(B, T).double(), typical, adv, mask,
                                     ref_logp=ref, options=o)[0].item()
    l64 = loss_of(exact)
    print(f"loss64 {l64:.6f} rlk {loss.item():.6f} rel {(loss.item()-l64)/abs(l64):.2e} | "
          f"rlk logp {(loss_of(logp)-l64)/abs(l64):.2e} | fixed {(loss_of(fixed)-l64)/abs(l64):.2e}")

if section in ("all", "logp"):
    x = hidden.view(N, H)
    tk = tokens.view(-1)
    with rlk.use_backends("cuda"):
        fwd = ev_time(lambda: rlk.linear_logp(x, weight, tk))
        gemm = ev_time(lambda: torch.mm(x, weight.t()))
        gemm32 = ev_time(lambda: torch.mm(x, weight.t(), out_dtype=torch.float32))
        print(f"linear_logp fwd N={N}: {fwd:.2f} ms; GEMM bf16 out {gemm:.2f}, f32 out {gemm32:.2f}"
              f" -> {fwd/gemm:.3f}x")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            rlk.linear_logp(x, weight, tk)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=8,
                                        max_name_column_width=60)[:2500])

if section in ("all", "sync"):
    import time
    import warnings
    with rlk.use_backends("cuda"):
        step()
        torch.cuda.synchronize()
        hosts = []
        for _ in range(4):
            t0 = time.perf_counter()
            step()
            hosts.append((time.perf_counter() - t0) * 1e3)
            torch.cuda.synchronize()
        print("host ms per step (queue empty at start):", [round(x, 1) for x in hosts])
        torch.cuda.set_sync_debug_mode(1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            step()
        torch.cuda.set_sync_debug_mode(0)
        import traceback
        print(f"syncs in one step: {len(caught)}")
        for w in caught[:4]:
            print("  ", str(w.message)[:120], "@", w.filename, w.lineno)

if section in ("all", "flag"):
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    x = hidden.view(N, H)
    tk = tokens.view(-1)
    errs = []
    for i in range(0, 4096, 1024):
        lg = x[i:i + 1024].double() @ weight.double().t()
        lg32 = torch.mm(x[i:i + 1024], weight.t(), out_dtype=torch.float32).double()
        errs.append((lg32 - lg).mean().item())
        lse = (lg.logsumexp(-1) - lg32.logsumexp(-1)).mean().item()
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    lg32b = torch.mm(x[:1024], weight.t(), out_dtype=torch.float32).double()
    lgd = x[:1024].double() @ weight.double().t()
    top = lgd > 4
    print("logit error mean (no reduced-precision reduction):", errs[:2], "lse64-lse32 mean", lse,
          "| default flag: mean", (lg32b - lgd).mean().item(), "at logits > 4:",
          (lg32b - lgd)[top].mean().item(), "n", int(top.sum()))
