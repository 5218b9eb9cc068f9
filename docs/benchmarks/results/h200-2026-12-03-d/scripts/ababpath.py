"""linear_policy_loss (GRPO k3, bf16) in turns: blocks of whole sequences (the old path choice)
against full blocks across sequences, at chunk budgets 768/960/1024 MiB, beside three cuBLAS
GEMMs, at B=16 V=128256 and B=8 V=151936; median ms/step over 4 turns of 5 steps, and each
setting's peak memory beyond the inputs and the gradients."""
import os
import statistics
import sys

import torch

import rlk
from rlk.native import linear_policy_loss as loop

dev = "cuda"
T, H = 1024, 4096
dt = torch.bfloat16
opts = dict(clip_low=0.2, clip_high=0.28, kl_coef=0.04, kl_estimator="k3", agg="token-mean")
new_choice = loop.choose_path


def old_choice(rows, length, chunk_rows, policy):
    if length <= chunk_rows or rows == 0:
        return loop.SEQUENCES
    return loop.TOKENS if loop._token_separable(policy) else loop.TWO_PASS


def timed(fn, reps=5):
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    s.record()
    for _ in range(reps):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / reps


SETTINGS = {"seq768": (old_choice, "768"), "tok768": (new_choice, "768"),
            "tok960": (new_choice, "960"), "tok1024": (new_choice, "1024")}
if len(sys.argv) > 1:  # e.g. tok768,tok960
    SETTINGS = {k: SETTINGS[k] for k in sys.argv[1].split(",")}

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
        return torch.autograd.grad(loss, (h, w))

    x = hidden.view(N, H)
    G = torch.randn(N, V, device=dev, dtype=dt)
    gh, gw = torch.empty(N, H, device=dev, dtype=dt), torch.empty(V, H, device=dev, dtype=dt)
    lg = torch.empty(N, V, device=dev, dtype=dt)

    def gemms():
        torch.mm(x, weight.t(), out=lg)
        torch.mm(G, weight, out=gh)
        torch.mm(G.t(), x, out=gw)

    times = {k: [] for k in (*SETTINGS, "gemms")}
    with rlk.use_backends("cuda"):
        for name, (choice, mb) in SETTINGS.items():  # plan and peak memory
            loop.choose_path, os.environ["RLK_CUDA_CHUNK_MB"] = choice, mb
            plan = rlk.explain("linear_policy_loss", h, w, tokens, typical, adv, mask,
                               ref_logp=ref, **opts).plan
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            grads = step()
            torch.cuda.synchronize()
            extra = torch.cuda.max_memory_allocated() - base - sum(t.nbytes for t in grads)
            del grads
            print(f"B={B} V={V} {name}: extra {extra / 2**30:.3f} GiB; {plan[:70]}", flush=True)
        for turn in range(4):
            for name, (choice, mb) in SETTINGS.items():
                loop.choose_path, os.environ["RLK_CUDA_CHUNK_MB"] = choice, mb
                times[name].append(timed(step))
            times["gemms"].append(timed(gemms))
    loop.choose_path = new_choice
    os.environ.pop("RLK_CUDA_CHUNK_MB")
    floor = statistics.median(times["gemms"])
    print(f"B={B} V={V}: three GEMMs {floor:.2f} ms; " + "; ".join(
        f"{k} {statistics.median(v):.2f} ms ({statistics.median(v) / floor:.3f}x)"
        for k, v in times.items() if k != "gemms"), flush=True)
    print("   turns: " + " | ".join(f"{k} " + " ".join(f"{t:.1f}" for t in v)
                                   for k, v in times.items()))
    del G, lg, gh, gw, hidden, weight, h, w, x
    torch.cuda.empty_cache()
